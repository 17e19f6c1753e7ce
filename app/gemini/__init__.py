"""Google's Gemini API (v1beta and v1): generateContent, its stream, countTokens, embeddings.

For Gemini CLI and Google's Gen AI SDKs. ``schemas`` validates the body (camelCase and
snake_case field names alike, as Google's API takes both), ``translation`` turns it into
the normalized request and the core's results back into candidates and their parts,
``bodies`` writes those in Google's wire format, and ``errors`` answers every error of
these paths in Google's envelope and statuses. ``embeddings`` takes embedContent and
batchEmbedContents into the normalized request of the embeddings door, and back.
"""
