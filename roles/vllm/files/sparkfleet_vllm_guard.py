# Copyright: sparkfleet.vllm contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The API key on every route of a vLLM server but its probes (loaded with ``--middleware``).

vLLM's own key check guards only paths under /v1, /v2, /inference and /cohere (vLLM 0.32 and
0.33, entrypoints/serve/middleware/authenticate.py); /invocations, /generative_scoring, /pooling,
/classify, /score, /rerank (all running the model), /tokenize, /kv_event_sources and every
development route answer anyone who reaches the port. This middleware asks for the same key
everywhere except the probes monitoring and the health gate read without one. It fails closed:
without a key in the environment only the probes answer. Runs inside the container, on the
image's Python, with nothing but the standard library.
"""

import hmac
import json
import os

OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version", "/load"})
REFUSAL = json.dumps({"error": {"message": "Unauthorized", "type": "authentication_error", "code": 401}}).encode()


class KeyOnEveryRoute:
    def __init__(self, app):
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        self.expected = f"Bearer {key}".encode() if key else None

    def authorized(self, scope):
        if scope.get("path") in OPEN_PATHS:
            return True
        if self.expected is None:
            return False
        given = [value for name, value in scope.get("headers") or [] if name.lower() == b"authorization"]
        return len(given) == 1 and hmac.compare_digest(given[0], self.expected)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.authorized(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": REFUSAL})
