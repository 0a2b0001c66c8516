"""Scripts that run on the managed hosts (sent as `python3 -c SOURCE`, so nothing has to be
installed first). `model_facts` needs only the standard library; `fetch_weights` runs in the vLLM
venv, which has huggingface_hub."""

from importlib import resources


def source(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.py").read_text()
