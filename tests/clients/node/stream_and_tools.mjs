// openai-node against the gateway: a stream with usage, then a tool round trip.
// Reads GATEWAY_BASE_URL and GATEWAY_API_KEY; prints one JSON object of what it saw.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.GATEWAY_BASE_URL,
  apiKey: process.env.GATEWAY_API_KEY,
  maxRetries: 0,
  timeout: 30_000,
});

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["city", "unit"],
    },
  },
};

async function streamWithUsage() {
  const stream = await client.chat.completions.create({
    model: "dev-chat",
    messages: [{ role: "user", content: "Hello from node" }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    text += chunk.choices[0]?.delta?.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, chunks, usage };
}

async function toolRoundTrip() {
  const messages = [{ role: "user", content: "Use get_weather for Paris" }];
  const first = await client.chat.completions.create({ model: "dev-chat", messages, tools: [weatherTool] });
  const call = first.choices[0].message.tool_calls[0];
  messages.push(
    { role: "assistant", content: null, tool_calls: first.choices[0].message.tool_calls },
    { role: "tool", tool_call_id: call.id, content: '{"temperature": 18}' },
  );
  const answer = await client.chat.completions.create({ model: "dev-chat", messages, tools: [weatherTool] });
  return {
    finishReason: first.choices[0].finish_reason,
    call: { name: call.function.name, arguments: JSON.parse(call.function.arguments) },
    answer: answer.choices[0].message.content,
    costs: [first.usage.cost.total_cost, answer.usage.cost.total_cost],
  };
}

async function streamedToolCall() {
  const runner = client.chat.completions.stream({
    model: "dev-chat",
    messages: [{ role: "user", content: "Use get_weather for Lyon" }],
    tools: [weatherTool],
  });
  const completion = await runner.finalChatCompletion();
  const call = completion.choices[0].message.tool_calls[0];
  return { name: call.function.name, arguments: JSON.parse(call.function.arguments) };
}

async function missingModel() {
  try {
    await client.models.retrieve("no-such-model");
    return null;
  } catch (error) {
    return { status: error.status, code: error.code, type: error.type };
  }
}

const result = {
  stream: await streamWithUsage(),
  tools: await toolRoundTrip(),
  streamedTool: await streamedToolCall(),
  model: (await client.models.retrieve("dev-chat")).id,
  missingModel: await missingModel(),
};
console.log(JSON.stringify(result));
