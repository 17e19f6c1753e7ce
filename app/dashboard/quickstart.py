"""The Quick start page's configurations: each door and client, with this service's address.

Each is text a holder copies as it is, with the key left as ``sk-gw-...`` or read from
``GATEWAY_API_KEY``; tests/clients/test_docs_snippets.py runs them against a live server.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.extensions import API_PREFIX


@dataclass(frozen=True)
class ClientConfiguration:
    """One copyable block: its id on the page, heading, what installs the client, and text."""

    name: str
    heading: str
    install: str
    language: str
    text: str


def client_configurations(root_url: str, model: str) -> list[ClientConfiguration]:
    """Return every client's configuration for the service at ``root_url`` (no trailing /)."""
    openai_base = root_url + API_PREFIX
    return [
        ClientConfiguration("key", "Your key", "", "sh", "export GATEWAY_API_KEY=sk-gw-...\n"),
        ClientConfiguration("curl", "curl", "", "sh", _curl(root_url, openai_base, model)),
        ClientConfiguration(
            "openai-python", "OpenAI SDK for Python", "pip install openai", "python",
            _openai_python(openai_base, model),
        ),
        ClientConfiguration(
            "openai-node", "OpenAI SDK for Node", "npm install openai", "js",
            _openai_node(openai_base, model),
        ),
        ClientConfiguration(
            "anthropic-python", "Anthropic SDK for Python", "pip install anthropic", "python",
            _anthropic_python(root_url, model),
        ),
        ClientConfiguration(
            "anthropic-typescript", "Anthropic SDK for TypeScript", "npm install @anthropic-ai/sdk",
            "js", _anthropic_typescript(root_url, model),
        ),
        ClientConfiguration(
            "codex-cli", "Codex CLI: ~/.codex/config.toml", "npm install -g @openai/codex",
            "toml", _codex(openai_base, model),
        ),
        ClientConfiguration(
            "claude-code", "Claude Code", "npm install -g @anthropic-ai/claude-code", "sh",
            _claude_code(root_url, model),
        ),
    ]  # fmt: skip


def _curl(root_url: str, openai_base: str, model: str) -> str:
    return (
        f"curl {openai_base}/chat/completions \\\n"
        '  -H "Authorization: Bearer $GATEWAY_API_KEY" -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello"}}]}}\'\n'
        f"curl {openai_base}/responses \\\n"
        '  -H "Authorization: Bearer $GATEWAY_API_KEY" -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{model}", "input": "Hello"}}\'\n'
        f"curl {openai_base}/messages \\\n"
        '  -H "x-api-key: $GATEWAY_API_KEY" -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{model}", "max_tokens": 256, '
        '"messages": [{"role": "user", "content": "Hello"}]}\'\n'
    )


def _openai_python(openai_base: str, model: str) -> str:
    return (
        "import os\n\nfrom openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{openai_base}", api_key=os.environ["GATEWAY_API_KEY"])\n'
        "reply = client.chat.completions.create(\n"
        f'    model="{model}", messages=[{{"role": "user", "content": "Hello"}}]\n'
        ")\n"
        'print(reply.choices[0].message.content, reply.usage.model_extra["cost"]["total_cost"])\n'
        f'response = client.responses.create(model="{model}", input="Hello")\n'
        "print(response.output_text)\n"
    )


def _openai_node(openai_base: str, model: str) -> str:
    return (
        'import OpenAI from "openai";\n\n'
        "const client = new OpenAI({\n"
        f'  baseURL: "{openai_base}",\n'
        "  apiKey: process.env.GATEWAY_API_KEY,\n"
        "});\n"
        "const reply = await client.chat.completions.create({\n"
        f'  model: "{model}",\n'
        '  messages: [{ role: "user", content: "Hello" }],\n'
        "});\n"
        "console.log(reply.choices[0].message.content, reply.usage.cost.total_cost);\n"
    )


def _anthropic_python(root_url: str, model: str) -> str:
    return (
        "import os\n\nimport anthropic\n\n"
        "claude = anthropic.Anthropic(\n"
        f'    base_url="{root_url}", api_key=os.environ["GATEWAY_API_KEY"]\n'
        ")\n"
        "message = claude.messages.create(\n"
        f'    model="{model}", max_tokens=1024, messages=[{{"role": "user", "content": "Hello"}}]\n'
        ")\n"
        'print(message.content[-1].text, message.usage.model_extra["cost"]["total_cost"])\n'
    )


def _anthropic_typescript(root_url: str, model: str) -> str:
    return (
        'import Anthropic from "@anthropic-ai/sdk";\n\n'
        "const claude = new Anthropic({\n"
        f'  baseURL: "{root_url}",\n'
        "  apiKey: process.env.GATEWAY_API_KEY,\n"
        "});\n"
        "const message = await claude.messages.create({\n"
        f'  model: "{model}",\n'
        "  max_tokens: 1024,\n"
        '  messages: [{ role: "user", content: "Hello" }],\n'
        "});\n"
        "console.log(message.content.at(-1).text, message.usage.cost.total_cost);\n"
    )


def _codex(openai_base: str, model: str) -> str:
    return (
        f'model = "{model}"\n'
        'model_provider = "gateway"\n\n'
        "[model_providers.gateway]\n"
        'name = "credit gateway"\n'
        f'base_url = "{openai_base}"\n'
        'env_key = "GATEWAY_API_KEY"\n'
        'wire_api = "responses"\n'
    )


def _claude_code(root_url: str, model: str) -> str:
    return (
        f"export ANTHROPIC_BASE_URL={root_url}\n"
        "export ANTHROPIC_AUTH_TOKEN=$GATEWAY_API_KEY\n"
        "export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1\n"
        f"claude --model {model}\n"
    )
