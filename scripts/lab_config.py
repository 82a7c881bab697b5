"""JupyterLab's settings for `make lab`: exploring the notebooks never writes outputs into notebooks/.

`make lab` passes this file with `--config`. Every notebook the server saves
(autosave included) is stripped first: no outputs, no execution counts, no
widget state, so notebooks/*.ipynb stay output-free as tests/test_notebooks.py
requires, whatever a person ran. Checkpoints go to build/lab_checkpoints, which
git ignores, instead of an `.ipynb_checkpoints` folder beside the notebooks.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def strip_outputs(model: dict, **_: object) -> None:
    """A `pre_save_hook`: drop a notebook model's outputs, execution counts and widget state in place."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    notebook = model["content"]
    notebook.get("metadata", {}).pop("widgets", None)
    for cell in notebook.get("cells", []):
        cell.get("metadata", {}).pop("execution", None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None


c = get_config()  # noqa: F821 (defined by traitlets when it loads this file)
c.ContentsManager.pre_save_hook = strip_outputs
c.FileCheckpoints.checkpoint_dir = str(ROOT / "build" / "lab_checkpoints")
