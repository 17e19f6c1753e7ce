"""Anthropic's Messages API: POST /v1/messages and count_tokens, for Claude Code and its SDKs.

``schemas`` validates the body, ``translation`` turns it into the normalized request and
the core's results back into content blocks and events, ``bodies`` writes those in
Anthropic's wire format, and ``errors`` answers every error of these paths in Anthropic's
envelope and statuses.
"""
