// A stock AI SDK chat as a page or a script builds it without a framework: the `ai` package's AbstractChat with its
// DefaultChatTransport (what useChat does), and the summary of what it holds that the tests compare.
// Used by use_chat.mjs (in Node) and page/page.mjs (bundled for Chromium by use_chat_in_chromium.mjs).
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
} from "ai";

/** The chat's state in plain fields; `onChange` is called after every change of its messages or status. */
class PlainState {
  constructor(messages, onChange) {
    this.fields = { status: "ready", messages };
    this.error = undefined;
    this.onChange = onChange;
  }
  get status() { return this.fields.status; }
  set status(value) { this.fields.status = value; this.onChange(); }
  get messages() { return this.fields.messages; }
  set messages(value) { this.fields.messages = value; this.onChange(); }
  pushMessage = (message) => { this.messages = [...this.messages, message]; };
  popMessage = () => { this.messages = this.messages.slice(0, -1); };
  replaceMessage = (index, message) => { this.messages = this.messages.map((m, i) => (i === index ? message : m)); };
  snapshot = (thing) => structuredClone(thing);
}

class Chat extends AbstractChat {
  constructor({ messages = [], onChange = () => {}, ...init }) {
    super({ ...init, state: new PlainState(messages, onChange) });
  }
}

/** A chat with id `id` against the endpoint at `base` that sends verdicts on its own, as useChat is set up. */
export function openChat(base, id, { messages, onChange, errors }) {
  return new Chat({
    id,
    messages,
    onChange,
    transport: new DefaultChatTransport({ api: `${base}/chat` }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onError: (error) => errors.push(String(error)),
  });
}

export const text = (message) => message.parts.filter((p) => p.type === "text").map((p) => p.text).join("");

/** The messages as the tests compare them: role, text, and each tool part's state and outcome. */
export const summary = (chat) => chat.messages.map((m) => ({ id: m.id, role: m.role, text: text(m),
  tools: m.parts.filter((p) => p.type.startsWith("tool-")).map((p) => ({ type: p.type, state: p.state, output: p.output,
    errorText: p.errorText, approval: p.state === "output-denied" ? p.approval : undefined })) }));
