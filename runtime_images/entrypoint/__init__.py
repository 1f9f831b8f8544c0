"""kvtune's runtime entrypoint: runs inside the vLLM image on a GPU node, checks the plan the
operator rendered against what NVML reports, adjusts the memory fraction to the memory really
free, reports its decisions and execs ``vllm serve``. Dependency-light on purpose (stdlib,
pydantic, pynvml): the vLLM image carries those and nothing of kvtune's operator stack."""
