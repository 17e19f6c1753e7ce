"""Adapters that turn a normalized chat request into an upstream's call.

ADAPTERS maps the catalog's ``kind`` of an upstream to the class that speaks its protocol.
"""

from app.providers.anthropic import AnthropicAdapter
from app.providers.base import Adapter
from app.providers.builtin import BuiltinAdapter
from app.providers.gemini import GeminiAdapter
from app.providers.openai_compat import OpenAICompatAdapter

ADAPTERS: dict[str, type[Adapter]] = {
    BuiltinAdapter.kind: BuiltinAdapter,
    OpenAICompatAdapter.kind: OpenAICompatAdapter,
    AnthropicAdapter.kind: AnthropicAdapter,
    GeminiAdapter.kind: GeminiAdapter,
}
