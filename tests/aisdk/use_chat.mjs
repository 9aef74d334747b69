// A stock AI SDK chat client (chat.mjs: the `ai` package's AbstractChat with its DefaultChatTransport, as useChat
// builds it) against the chat endpoint at argv[2]; argv[3] names the scenario. Prints what the chat holds as one
// JSON line.
import { openChat, summary, text } from "./chat.mjs";

const [base, scenario] = process.argv.slice(2);

async function until(what, test) {
  for (let i = 0; i < 2000; i++) {  // a bound for a stuck run (20 s), not a speed check
    if (test()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`timed out waiting for ${what}`);
}

const errors = [];
const chat = openChat(base, `chat-${scenario}`, { errors });
const out = { scenario };

if (scenario === "approve" || scenario === "deny") {
  await chat.sendMessage({ text: "deploy it" });
  const asked = chat.lastMessage.parts.find((p) => p.state === "approval-requested");
  out.asked = { type: asked.type, state: asked.state, signed: typeof asked.approval.signature === "string" };
  await chat.addToolApprovalResponse({ id: asked.approval.id, approved: scenario === "approve", reason: "not now" });
  const settled = (p) => ["output-available", "output-error", "output-denied"].includes(p.state);
  await until("the answer after the verdict", () => chat.status === "ready" && chat.lastMessage.parts.some(settled)
    && text(chat.lastMessage).length > 0);
} else if (scenario === "stop") {
  const sending = chat.sendMessage({ text: "please lookup" });
  await until("streamed text", () => chat.lastMessage?.role === "assistant" && text(chat.lastMessage).length > 0);
  const runId = chat.lastMessage.id;
  await chat.stop();  // aborts the fetch: the durable run would go on without it
  const stopped = await fetch(`${base}/chat/${chat.id}/stop`, { method: "POST" });
  out.stop = { status: stopped.status, body: await stopped.json(), runId };
  await sending;
  await chat.resumeStream();  // what a reload does: nothing to resume (204)
  out.afterResume = chat.status;
} else if (scenario === "regenerate") {
  await chat.sendMessage({ text: "hello there" });
  const first = chat.lastMessage.id;
  await chat.regenerate();
  out.regenerated = { first, second: chat.lastMessage.id };
} else {
  throw new Error(`unknown scenario ${scenario}`);
}
out.status = chat.status;
out.errors = errors;
out.messages = summary(chat);
console.log(JSON.stringify(out));
