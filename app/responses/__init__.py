"""OpenAI's Responses API, a front door on the generation core, and its stored responses.

``schemas`` validates a request into Responses items; ``conversation`` rebuilds what a
request continues (``previous_response_id``, item references) from ``store``;
``translation`` turns items into the normalized chat request and the core's results back
into output items; ``bodies`` writes the Response object and its stream's events, the
wire format alone; ``views`` wires them in the order of the core.
"""
