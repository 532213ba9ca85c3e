"""An HTTP JSON API over a model, with dynamic batching, on FastAPI + uvicorn (`pip install 'bertkit[serve]'`).

    bertkit serve MODEL --port 8000
    curl -s localhost:8000/fill-mask -d '{"text": "Paris is the [MASK] of France."}'
    curl -s localhost:8000/embed -d '{"inputs": ["A man is eating food."]}'          # text-embeddings-inference
    curl -s localhost:8000/v1/embeddings -d '{"input": "A man is eating food.", "model": "m"}'   # OpenAI

Routes follow the model's head: `/embed`, `/v1/embeddings` and `/tokenize` always; `/fill-mask` (masked-LM head);
`/classify`, `/predict` and `/rerank` (sequence classification); `/tag` (token classification); `/answer` (question
answering); `GET /health`, `/info`, `/metrics`, `/openapi.json`.

Modules: `limits` (ServeConfig, bounded JSON), `batcher` (the dynamic batcher), `schemas` (pydantic bodies), `app`
(routes and errors), `endpoints` (the model's batch functions), `metrics` (Prometheus), `server` (uvicorn). `limits`
and `batcher` need only the standard library; the rest needs the `serve` extra, and importing a name from them
without it raises a one-line error saying what to install.
"""

from __future__ import annotations

from bertkit.serve.batcher import Batcher
from bertkit.serve.limits import MissingServeExtra, RequestError, ServeConfig, require_serve_extra

__all__ = ["ServeConfig", "RequestError", "Batcher", "MissingServeExtra", "Endpoint", "make_app", "model_endpoints",
           "model_info", "absent_routes", "ServerThread", "serve_model"]

_LAZY = {"Endpoint": "app", "make_app": "app", "model_endpoints": "endpoints", "model_info": "endpoints",
         "absent_routes": "endpoints", "ServerThread": "server", "serve_model": "server"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'bertkit.serve' has no attribute {name!r}")
    require_serve_extra()
    import importlib
    return getattr(importlib.import_module(f"bertkit.serve.{_LAZY[name]}"), name)
