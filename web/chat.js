// Minimal chat client for affinity's /v1/chat/completions: streams the reply
// (SSE over fetch) and shows reasoning_content apart from the answer.
"use strict";

const log = document.getElementById("log");
const input = document.getElementById("input");
const sendBtn = document.getElementById("send");
const stopBtn = document.getElementById("stop");
const thinkingBox = document.getElementById("thinking");
let history = [];
let controller = null;

fetch("/v1/models").then(r => r.json()).then(j => {
  document.getElementById("model").textContent = j.data && j.data[0] ? j.data[0].id : "";
}).catch(() => {});

function bubble(cls, text) {
  const div = document.createElement("div");
  div.className = "msg " + cls;
  if (text !== undefined) div.textContent = text;
  log.appendChild(div);
  log.scrollTop = log.scrollHeight;
  return div;
}

function assistantBubble() {
  const div = bubble("assistant");
  const details = document.createElement("details");
  details.className = "reasoning";
  details.open = true;
  details.hidden = true;
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const reasoning = document.createElement("div");
  reasoning.className = "reasoning-text";
  details.append(summary, reasoning);
  const content = document.createElement("div");
  content.className = "content";
  div.append(details, content);
  return { div, details, reasoning, content, tools: [] };
}

// Applies one chat.completion.chunk to the bubble and the message being built.
function applyChunk(view, msg, chunk) {
  if (!chunk.choices || !chunk.choices.length) return;
  const d = chunk.choices[0].delta || {};
  if (d.reasoning_content) {
    view.details.hidden = false;
    view.reasoning.textContent += d.reasoning_content;
    msg.reasoning_content = (msg.reasoning_content || "") + d.reasoning_content;
  }
  if (d.content) {
    if (view.details.open && msg.content === "") view.details.open = false;  // answer started
    view.content.textContent += d.content;
    msg.content += d.content;
  }
  for (const tc of d.tool_calls || []) {
    if (!msg.tool_calls) msg.tool_calls = [];
    if (!msg.tool_calls[tc.index]) {
      msg.tool_calls[tc.index] = { id: tc.id, type: "function", function: { name: tc.function.name, arguments: "" } };
      const el = document.createElement("div");
      el.className = "tool";
      view.div.appendChild(el);
      view.tools[tc.index] = el;
    }
    const call = msg.tool_calls[tc.index];
    call.function.arguments += (tc.function && tc.function.arguments) || "";
    view.tools[tc.index].textContent = "tool call: " + call.function.name + "(" + call.function.arguments + ")";
  }
  log.scrollTop = log.scrollHeight;
}

async function send(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const view = assistantBubble();
  const msg = { role: "assistant", content: "" };
  controller = new AbortController();
  sendBtn.disabled = true;
  stopBtn.disabled = false;
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages: history, stream: true,
                             thinking: { type: thinkingBox.checked ? "enabled" : "disabled" } }),
      signal: controller.signal,
    });
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || ("HTTP " + res.status));
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let end;
      while ((end = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, end);
        buf = buf.slice(end + 2);
        if (!event.startsWith("data: ")) continue;  // ": ping" keep-alives
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        applyChunk(view, msg, chunk);
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") bubble("error", String(e.message || e));
  } finally {
    history.push(msg);
    view.div.dataset.done = "1";
    controller = null;
    sendBtn.disabled = false;
    stopBtn.disabled = true;
  }
}

document.getElementById("form").addEventListener("submit", ev => {
  ev.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = "";
  send(text);
});
input.addEventListener("keydown", ev => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    document.getElementById("form").requestSubmit();
  }
});
stopBtn.addEventListener("click", () => controller && controller.abort());
document.getElementById("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  history = [];
  log.textContent = "";
});
