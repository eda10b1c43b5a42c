"""``mmagent serve``: an OpenAI-compatible chat-completions server over the transformers backend.

Endpoints: ``POST /v1/chat/completions`` (text, ``image_url`` and ``video_url`` parts as base64 data URLs;
remote URLs are refused, the server fetches nothing; ``"stream": true`` answers with server-sent events),
``GET /v1/models``, ``GET /health`` and ``GET /metrics``. Answers follow the OpenAI schema
(``choices[0].message.content``, ``finish_reason``, ``usage``) plus vLLM's ``stop_reason`` (the stop string
that ended the turn) and ``usage.prompt_tokens_details.cached_tokens``. ``n > 1`` is refused with HTTP 400.

One module, one job:

* :mod:`~mmagent.serve.request`: the request model (pydantic) and the server's errors;
* :mod:`~mmagent.serve.response`: completions, stream chunks and errors in OpenAI's JSON;
* :mod:`~mmagent.serve.conversations`: messages into sessions, picking up an episode's kept KV cache;
* :mod:`~mmagent.serve.store`: the kept sessions, within a count, a byte budget and an idle time;
* :mod:`~mmagent.serve.engine`: the bounded queue and the thread that batches requests on the model;
* :mod:`~mmagent.serve.metrics`: counters for ``/health`` and ``/metrics``;
* :mod:`~mmagent.serve.app`: the HTTP routes (Starlette);
* :mod:`~mmagent.serve.server`: uvicorn in the foreground or a background thread, and loading the model.

For throughput on a GPU at scale use ``vllm serve``, which the same client talks to.
"""

from mmagent.serve.app import DEFAULT_MAX_REQUEST_BYTES, make_app
from mmagent.serve.conversations import Conversations
from mmagent.serve.engine import ChatEngine, EngineConfig
from mmagent.serve.request import ChatRequest, RequestError, ServerBusy, parse_request
from mmagent.serve.server import Server, load_engine
from mmagent.serve.store import SessionStore

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "ChatEngine", "ChatRequest", "Conversations", "EngineConfig", "RequestError",
           "Server", "ServerBusy", "SessionStore", "load_engine", "make_app", "parse_request"]
