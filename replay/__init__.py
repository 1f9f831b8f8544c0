"""``kvtune replay``: vLLM's metrics served from a request trace replayed through the KV-cache
simulator (``sim``) or a fixed-rate instance model (``instance``), optionally following a
Deployment's rendered vLLM flags (``follow``); ``exporter`` is the HTTP server."""
