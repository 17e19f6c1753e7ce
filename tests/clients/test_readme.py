"""The README's "Calling it" examples, taken from README.md and run against a live server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
README_BASE_URL = "http://localhost:8000"
README_KEY = "sk-gw-..."
FENCED_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def calling_it_examples(language: str) -> list[str]:
    """The ``language`` code blocks of the README's "## Calling it" section."""
    text = README.read_text()
    section = text.split("\n## Calling it\n", 1)[1].split("\n## ", 1)[0]
    return [code for lang, code in FENCED_BLOCK.findall(section) if lang == language]


def json_documents(output: str) -> list:
    """Decode the JSON documents printed one after another (curl adds no newline)."""
    decoder, documents, position = json.JSONDecoder(), [], 0
    while position < len(output.rstrip()):
        document, position = decoder.raw_decode(output, position)
        documents.append(document)
        while position < len(output) and output[position].isspace():
            position += 1
    return documents


def test_the_readme_has_python_and_curl_examples():
    assert len(calling_it_examples("python")) == 2  # the openai SDK, the anthropic SDK
    (curl,) = calling_it_examples("sh")
    assert curl.count("curl ") == 2 and "$KEY" in curl


def test_the_python_example_runs(live_server, funded_key):
    example = calling_it_examples("python")[0]
    assert README_BASE_URL in example and README_KEY in example
    code = example.replace(README_BASE_URL, live_server.url).replace(README_KEY, funded_key.key)

    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )

    assert completed.returncode == 0, completed.stderr
    models, pricing, reply, *chunks, response, followup = completed.stdout.splitlines()
    assert "'dev-chat'" in models and "'dev-chat-mini'" in models
    assert "'completion': 1.5" in pricing
    assert reply.startswith("Hello") and float(reply.rsplit(" ", 1)[1]) > 0
    assert chunks[0].startswith("ChatCompletionChunk(")
    assert "cost={'total_cost':" in chunks[-1]
    assert response.startswith("Hello ") and float(response.rsplit(" ", 1)[1]) > 0
    assert followup.startswith("And again ")


def test_the_curl_example_runs(live_server, funded_key):
    (example,) = calling_it_examples("sh")
    assert README_BASE_URL in example
    script = example.replace(README_BASE_URL, live_server.url)

    completed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "KEY": funded_key.key},
    )

    assert completed.returncode == 0, completed.stderr
    completion, model = json_documents(completed.stdout)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"].startswith("Hello")
    assert completion["usage"]["cost"]["total_cost"] > 0
    assert model["id"] == "dev-chat" and model["object"] == "model"


def test_the_anthropic_example_runs(live_server, funded_key, tmp_path):
    example = calling_it_examples("python")[1]
    assert "import anthropic" in example and README_KEY in example
    code = example.replace(README_BASE_URL, live_server.url).replace(README_KEY, funded_key.key)

    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        # Only the example's credentials: none from variables or the SDK's config files.
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )

    assert completed.returncode == 0, completed.stderr
    message, streamed, counted = completed.stdout.splitlines()
    assert message.startswith("Hello") and float(message.rsplit(" ", 1)[1]) > 0
    assert streamed.startswith("Hello")
    assert int(counted) == 8  # 4 + 1 (Hello) + 3 for the reply, as docs/builtin-model.md counts
