// The Vercel AI SDK's OpenAI provider (the Responses API) against the gateway:
// generateText and streamText, each with a tool the model calls, then answers from.
// Prints one JSON object; GATEWAY_BASE_URL and GATEWAY_API_KEY say where and as whom.
import { generateText, jsonSchema, stepCountIs, streamText, tool } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const openai = createOpenAI({
  baseURL: process.env.GATEWAY_BASE_URL,
  apiKey: process.env.GATEWAY_API_KEY,
});
const calls = [];
const tools = {
  get_weather: tool({
    description: 'Return the weather for a city.',
    inputSchema: jsonSchema({
      type: 'object',
      properties: { city: { type: 'string' } },
      required: ['city'],
      additionalProperties: false,
    }),
    execute: async ({ city }) => {
      calls.push(city);
      return `Sunny in ${city}`;
    },
  }),
};
const common = { model: openai('dev-chat'), maxRetries: 0, tools, stopWhen: stepCountIs(3) };

const whole = await generateText({ ...common, prompt: 'Weather in Paris? Use get_weather.' });
const plain = await generateText({ ...common, tools: undefined, prompt: 'Hello there' });

const errors = [];
const streamed = streamText({
  ...common,
  prompt: 'Weather in Rome? Use get_weather.',
  onError: ({ error }) => errors.push(String(error?.message ?? error)),
});
let text = '';
for await (const part of streamed.textStream) text += part;
const steps = await streamed.steps;

console.log(JSON.stringify({
  generate: {
    text: whole.text,
    finishReason: whole.finishReason,
    steps: whole.steps.length,
    usage: whole.totalUsage,
    responseIds: whole.steps.map((step) => step.response.id),
  },
  plain: { text: plain.text, finishReason: plain.finishReason, usage: plain.usage },
  stream: {
    text,
    finishReason: await streamed.finishReason,
    steps: steps.length,
    usage: await streamed.totalUsage,
    responseIds: steps.map((step) => step.response.id),
    errors,
  },
  calls,
}));
