// @anthropic-ai/sdk against the gateway's Messages door: a whole message, a stream, a tool
// call streamed, and an unknown model. Reads GATEWAY_BASE_URL (no /v1: the SDK adds it) and
// GATEWAY_API_KEY; prints one JSON object of what it saw.
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({
  baseURL: process.env.GATEWAY_BASE_URL,
  apiKey: process.env.GATEWAY_API_KEY,
  maxRetries: 0,
  timeout: 30_000,
});

const weatherTool = {
  name: "get_weather",
  description: "Current weather in a city",
  input_schema: {
    type: "object",
    properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
    required: ["city", "unit"],
  },
};

async function create() {
  const message = await client.messages.create({
    model: "dev-chat",
    max_tokens: 32000,
    messages: [{ role: "user", content: "Hello from node" }],
  });
  return { id: message.id, content: message.content, stopReason: message.stop_reason, usage: message.usage };
}

async function stream() {
  const events = [];
  const runner = client.messages.stream({
    model: "dev-chat",
    max_tokens: 4000,
    messages: [{ role: "user", content: "Hello from node" }],
    thinking: { type: "enabled", budget_tokens: 2048 },
  });
  let text = "";
  runner.on("text", (delta) => { text += delta; });
  runner.on("streamEvent", (event) => { events.push(event); });
  const message = await runner.finalMessage();
  const end = events.find((event) => event.type === "message_delta");
  return {
    text,
    events: events.map((event) => event.type),
    final: { content: message.content, stopReason: message.stop_reason, usage: message.usage },
    deltaUsage: end.usage,
  };
}

async function streamedTool() {
  const runner = client.messages.stream({
    model: "dev-chat",
    max_tokens: 500,
    messages: [{ role: "user", content: "Use get_weather for Lyon" }],
    tools: [weatherTool],
  });
  const message = await runner.finalMessage();
  return { content: message.content, stopReason: message.stop_reason };
}

async function missingModel() {
  try {
    await client.messages.create({ model: "claude-opus-5-5", max_tokens: 10, messages: [{ role: "user", content: "x" }] });
    return null;
  } catch (error) {
    return { name: error.constructor.name, status: error.status, type: error.error?.error?.type };
  }
}

const result = {
  create: await create(),
  stream: await stream(),
  streamedTool: await streamedTool(),
  missingModel: await missingModel(),
};
console.log(JSON.stringify(result));
