// Google's Gen AI SDK for JavaScript against the Gemini door: generate, stream, a refusal.
import { GoogleGenAI } from "@google/genai";

const ai = new GoogleGenAI({
  apiKey: process.env.GATEWAY_API_KEY,
  httpOptions: { baseUrl: process.env.GATEWAY_BASE_URL },
});

const generated = await ai.models.generateContent({ model: "dev-chat", contents: "Hello from node" });
const chunks = [];
for await (const chunk of await ai.models.generateContentStream({
  model: "dev-chat",
  contents: "Hello from node",
})) {
  chunks.push(chunk);
}
let missing;
try {
  await ai.models.generateContent({ model: "no-such-model", contents: "Hi" });
} catch (error) {
  missing = { name: error.name, status: error.status, message: error.message };
}
const last = chunks[chunks.length - 1];
console.log(
  JSON.stringify({
    generate: {
      text: generated.text,
      responseId: generated.responseId,
      finishReason: generated.candidates[0].finishReason,
      usage: generated.usageMetadata,
    },
    stream: {
      text: chunks.map((chunk) => chunk.text ?? "").join(""),
      count: chunks.length,
      responseIds: [...new Set(chunks.map((chunk) => chunk.responseId))],
      finishReason: last.candidates[0].finishReason,
      usage: last.usageMetadata,
    },
    missing,
  }),
);
