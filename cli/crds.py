"""`kvtune crds`: print the CRD manifests generated from the API types, or write them."""

from __future__ import annotations

from pathlib import Path

import click

from kvtune.operator.api.crdgen import CRD_FILES


def default_crds_dir() -> Path:
    # The repository's crds/ next to the operator/ folder (an editable install).
    return Path(__file__).resolve().parent.parent / "crds"


@click.command()
@click.option("--write", is_flag=True, help="Write crds/*.yaml instead of printing.")
@click.option("--check", is_flag=True, help="Exit 1 when crds/ differs from the generated.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Folder of the manifests (default: the repository's crds/).")
def crds(write: bool, check: bool, directory: Path | None) -> None:
    """Generate the CRD manifests from kvtune's API types."""
    folder = directory or default_crds_dir()
    stale = []
    for filename, generate in CRD_FILES.items():
        text = generate()
        path = folder / filename
        if write:
            folder.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                click.echo(f"wrote {path}")
            else:
                click.echo(f"unchanged {path}")
        elif check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            click.echo(text, nl=False)
    if stale:
        raise click.ClickException(
            f"out of date: {', '.join(stale)}; run `kvtune crds --write` (or `make crds`)")
