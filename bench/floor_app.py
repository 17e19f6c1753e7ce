"""The floor of the stack: a bare Flask view under the same gunicorn/gevent settings.

It answers a canned chat completion with no auth, no validation and no billing, so that
the benchmark can report the gateway's CPU per request as a ratio against it.
"""

from flask import Flask, Response, request

from app.encoding import dumps, loads

app = Flask(__name__)
ANSWER = dumps(
    {
        "id": "chatcmpl-floor",
        "object": "chat.completion",
        "created": 0,
        "model": "dev-chat-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello Quiet river stone."},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 6, "total_tokens": 14},
    }
)


@app.post("/v1/chat/completions")
def complete() -> Response:
    """Read the body and answer the canned completion."""
    loads(request.get_data())
    return Response(ANSWER, mimetype="application/json")
