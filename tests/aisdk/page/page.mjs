// A chat page as an app without a framework builds it on the `ai` package (chat.mjs): the endpoint at ?api=, the chat
// ?chat=. It renders the messages, an approval request as Approve/Deny buttons that call addToolApprovalResponse,
// keeps the messages in sessionStorage (the app's own store) and, on load, resumes a stream in flight as
// useChat({ resume: true }) does. body[data-status] is the chat's status; window.chatState() what it holds (and
// `restored`: the texts of the messages it loaded).
import { openChat, summary, text } from "../chat.mjs";

const params = new URLSearchParams(location.search);
const key = `messages:${params.get("chat")}`;
const errors = [];
const list = document.getElementById("messages");

function render() {
  sessionStorage.setItem(key, JSON.stringify(chat.messages));
  document.body.dataset.status = chat.status;
  list.replaceChildren(...chat.messages.map((message) => {
    const item = document.createElement("li");
    item.dataset.role = message.role;
    item.append(`${message.role}: ${text(message)}`);
    for (const part of message.parts.filter((p) => p.type.startsWith("tool-"))) {
      const tool = document.createElement("div");
      tool.className = "tool";
      tool.dataset.state = part.state;
      tool.append(`${part.type} ${part.state}`);
      if (part.state === "approval-requested") {
        for (const approved of [true, false]) {
          const button = document.createElement("button");
          button.className = approved ? "approve" : "deny";
          button.textContent = approved ? "Approve" : "Deny";
          button.onclick = () => chat.addToolApprovalResponse({ id: part.approval.id, approved, reason: "not now" });
          tool.append(" ", button);
        }
      }
      item.append(tool);
    }
    return item;
  }));
}

const restored = JSON.parse(sessionStorage.getItem(key) ?? "[]");
const chat = openChat(params.get("api"), params.get("chat"), {
  messages: restored,
  onChange: () => queueMicrotask(render),
  errors,
});
document.getElementById("composer").onsubmit = (event) => {
  event.preventDefault();
  chat.sendMessage({ text: document.getElementById("prompt").value });
};
window.chatState = () => ({ status: chat.status, errors, messages: summary(chat), restored: restored.map(text) });
render();
await chat.resumeStream();
document.body.dataset.ready = "1";
