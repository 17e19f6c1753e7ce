"""The generation core: a request's life on normalized types, whichever door it came in by.

A front door (Chat Completions, Responses, Messages) parses its wire format into the
normalized request (``app.providers.base.ChatRequest``), calls the core to start the
generation (hold its worst case), run it whole or streamed on the model's routes, and
settle it once; then it encodes the normalized result, or each normalized chunk, back
into its wire format. A door does nothing else: no pricing, no holds, no records, no
retries. The core knows no wire format but the normalized one; it never imports a door,
and a door never imports another door.
"""
