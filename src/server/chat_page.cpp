#include "server/chat_page.h"

namespace ms::server {
namespace {

// Markdown is rendered from text whose HTML was escaped first, so model output can never inject markup;
// links are kept only for http(s) URLs. Test hooks: a URL fragment #ask=TEXT sends TEXT once the page has
// loaded (#ask=TEXT&stop also presses Stop when the first words arrive); body[data-state] is "busy" while an
// answer streams and "done" / "error" / "stopped" after it.
constexpr std::string_view kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>moeserve chat</title>
<style>
:root { --bg: #f6f7f9; --panel: #fff; --text: #1d2330; --muted: #6b7385; --accent: #2f6fed; --border: #dfe3ea;
        --user: #e8f0fe; --code: #f0f2f5; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--text);
       background: var(--bg); height: 100vh; display: flex; flex-direction: column; }
header { display: flex; align-items: center; gap: 12px; padding: 10px 18px; background: var(--panel);
         border-bottom: 1px solid var(--border); flex-wrap: wrap; }
header h1 { font-size: 17px; margin: 0; }
#model { color: var(--muted); font-size: 13px; }
#settings { margin-left: auto; display: flex; gap: 10px; align-items: center; font-size: 13px; flex-wrap: wrap; }
#settings label { color: var(--muted); display: flex; align-items: center; gap: 4px; }
#settings input { width: 70px; padding: 3px 5px; border: 1px solid var(--border); border-radius: 5px; font: inherit; }
#settings input#key { width: 110px; }
main { flex: 1; overflow-y: auto; padding: 18px; }
.msg { max-width: 860px; margin: 0 auto 14px; padding: 10px 14px; border-radius: 10px; background: var(--panel);
       border: 1px solid var(--border); overflow-wrap: anywhere; }
.msg.user { background: var(--user); border-color: #cddcfb; }
.msg .who { font-size: 12px; font-weight: 600; color: var(--muted); margin-bottom: 4px; }
.msg .content p { margin: 0 0 8px; } .msg .content p:last-child { margin-bottom: 0; }
.msg .content pre { background: var(--code); padding: 8px 10px; border-radius: 6px; overflow-x: auto; }
.msg .content code { background: var(--code); padding: 1px 4px; border-radius: 4px; font-size: 13px; }
.msg .content pre code { padding: 0; background: none; }
.msg .content h1, .msg .content h2, .msg .content h3 { font-size: 16px; margin: 8px 0 4px; }
.msg .content ul, .msg .content ol { margin: 4px 0 8px; padding-left: 22px; }
details.reasoning { margin-bottom: 8px; color: var(--muted); font-size: 13px; }
details.reasoning summary { cursor: pointer; }
details.reasoning div { white-space: pre-wrap; border-left: 3px solid var(--border); padding-left: 8px; margin-top: 4px; }
.tools { font-size: 13px; } .meta { font-size: 12px; color: var(--muted); margin-top: 6px; }
.error { color: #b42318; }
footer { padding: 12px 18px; background: var(--panel); border-top: 1px solid var(--border); }
form { max-width: 860px; margin: 0 auto; display: flex; gap: 8px; }
textarea { flex: 1; resize: none; height: 54px; padding: 8px 10px; font: inherit; border: 1px solid var(--border);
           border-radius: 8px; }
button { padding: 0 18px; border: 0; border-radius: 8px; font: inherit; cursor: pointer; background: var(--accent);
         color: #fff; }
button#stop { background: #b42318; } button:disabled { opacity: .45; cursor: default; }
</style>
</head>
<body data-state="idle">
<header>
  <h1>moeserve</h1><span id="model">connecting...</span>
  <div id="settings">
    <label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7"></label>
    <label>top_p <input id="top_p" type="number" min="0.01" max="1" step="0.05" value="1"></label>
    <label>max_tokens <input id="max_tokens" type="number" min="1" step="1" value="1024"></label>
    <label>API key <input id="key" type="password" placeholder="(none)"></label>
    <button id="clear" type="button" style="background:#6b7385;padding:4px 10px">New chat</button>
  </div>
</header>
<main id="log"></main>
<footer>
  <form id="form">
    <textarea id="input" placeholder="Send a message (Enter to send, Shift+Enter for a new line)"></textarea>
    <button id="send" type="submit">Send</button>
    <button id="stop" type="button" disabled>Stop</button>
  </form>
</footer>
<script>
"use strict";
const $ = (s) => document.querySelector(s);
const turns = [];
let model = null, controller = null, stopEarly = false;

function esc(s) {
  return s.replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function inline(s) {  // s is escaped already
  return s.replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
}
function blocks(text) {
  let html = "", para = [], list = null;
  const flush = () => {
    if (para.length) html += "<p>" + para.map(inline).join("<br>") + "</p>";
    para = [];
    if (list) html += "<" + list.tag + ">" + list.items.map((i) => "<li>" + inline(i) + "</li>").join("") +
                      "</" + list.tag + ">";
    list = null;
  };
  for (const line of esc(text).split("\n")) {
    let m;
    if ((m = line.match(/^(#{1,3})\s+(.*)$/))) { flush(); html += "<h" + m[1].length + ">" + inline(m[2]) + "</h" + m[1].length + ">"; }
    else if ((m = line.match(/^\s*[-*]\s+(.*)$/)) || (m = line.match(/^\s*\d+[.)]\s+(.*)$/))) {
      const tag = /^\s*\d/.test(line) ? "ol" : "ul";
      if (para.length || (list && list.tag !== tag)) flush();
      if (!list) list = {tag, items: []};
      list.items.push(m[1]);
    } else if (line.trim() === "") flush();
    else { if (list) flush(); para.push(line); }
  }
  flush();
  return html;
}
function markdown(text) {
  const parts = text.split("```");
  return parts.map((p, i) => {
    if (i % 2 === 0) return blocks(p);
    const nl = p.indexOf("\n");
    return "<pre><code>" + esc(nl >= 0 ? p.slice(nl + 1) : p) + "</code></pre>";
  }).join("");
}

function addMessage(role) {
  const el = document.createElement("div");
  el.className = "msg " + role;
  el.innerHTML = '<div class="who"></div><details class="reasoning" hidden><summary>Reasoning</summary><div></div>' +
                 '</details><div class="content"></div><div class="tools"></div><div class="meta"></div>';
  el.querySelector(".who").textContent = role === "user" ? "You" : (model ? model.id : "assistant");
  $("#log").appendChild(el);
  return el;
}
function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("#key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}
async function loadModel() {
  try {
    const r = await fetch("/v1/models", {headers: headers()});
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : r.statusText);
    model = j.data[0];
    $("#model").textContent = model.id + " \u00b7 context " + model.max_model_len.toLocaleString("en-US") + " tokens";
    $("#model").dataset.model = model.id;
    $("#model").dataset.context = model.max_model_len;
  } catch (e) {
    $("#model").textContent = "cannot read /v1/models: " + e.message;
  }
}
function setBusy(busy, state) {
  $("#send").disabled = busy;
  $("#stop").disabled = !busy;
  document.body.dataset.state = state;
}
function num(id) { const v = parseFloat($(id).value); return Number.isFinite(v) ? v : undefined; }

async function send(text) {
  if (!text.trim() || controller) return;
  if (!model) await loadModel();
  const u = addMessage("user");
  u.querySelector(".content").innerHTML = markdown(text);
  turns.push({role: "user", content: text});
  const a = addMessage("assistant");
  const reasoningBox = a.querySelector("details"), content = a.querySelector(".content");
  let answer = "", reasoning = "", usage = null, finish = null;
  const calls = [];
  const started = performance.now();
  controller = new AbortController();
  setBusy(true, "busy");
  const render = () => {
    content.innerHTML = markdown(answer);
    if (reasoning) { reasoningBox.hidden = false; reasoningBox.querySelector("div").textContent = reasoning; }
    a.querySelector(".tools").innerHTML = calls.map((c) =>
      "<pre><code>" + esc(c.name + "(" + c.arguments + ")") + "</code></pre>").join("");
    $("#log").scrollTop = $("#log").scrollHeight;
    if (stopEarly && answer && controller) { stopEarly = false; $("#stop").click(); }
  };
  let state = "done";
  try {
    const body = {model: model ? model.id : "", messages: turns, stream: true,
                  stream_options: {include_usage: true}, temperature: num("#temperature"), top_p: num("#top_p"),
                  max_tokens: Math.round(num("#max_tokens") || 0) || undefined};
    const r = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify(body),
                                                   signal: controller.signal});
    if (!r.ok) { const j = await r.json().catch(() => ({})); throw new Error(j.error ? j.error.message : r.statusText); }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
          const j = JSON.parse(line.slice(6));
          if (j.error) throw new Error(j.error.message);
          if (j.usage) usage = j.usage;
          const ch = j.choices && j.choices[0];
          if (!ch) continue;
          const d = ch.delta || {};
          if (d.content) answer += d.content;
          if (d.reasoning_content) reasoning += d.reasoning_content;
          for (const t of d.tool_calls || []) {
            const c = calls[t.index] || (calls[t.index] = {name: "", arguments: ""});
            if (t.function && t.function.name) c.name += t.function.name;
            if (t.function && t.function.arguments) c.arguments += t.function.arguments;
          }
          if (ch.finish_reason) finish = ch.finish_reason;
        }
        render();
      }
    }
  } catch (e) {
    if (e.name === "AbortError") { state = "stopped"; }
    else { state = "error"; const p = document.createElement("div"); p.className = "error"; p.textContent = e.message;
           content.appendChild(p); }
  }
  render();
  turns.push({role: "assistant", content: answer});
  const secs = (performance.now() - started) / 1000;
  const meta = [];
  if (state === "stopped") meta.push("stopped");
  if (finish) meta.push("finish: " + finish);
  if (usage) meta.push(usage.completion_tokens + " tokens, " + (usage.completion_tokens / secs).toFixed(1) + " tokens/s");
  a.querySelector(".meta").textContent = meta.join(" \u00b7 ");
  controller = null;
  setBusy(false, state);
}

$("#form").addEventListener("submit", (e) => { e.preventDefault(); const t = $("#input").value; $("#input").value = ""; send(t); });
$("#input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("#form").requestSubmit(); }
});
$("#stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("#clear").addEventListener("click", () => { if (!controller) { turns.length = 0; $("#log").innerHTML = ""; } });
for (const id of ["temperature", "top_p", "max_tokens", "key"]) {
  const el = document.getElementById(id), saved = localStorage.getItem("moeserve." + id);
  if (saved !== null) el.value = saved;
  el.addEventListener("change", () => { localStorage.setItem("moeserve." + id, el.value); if (id === "key") loadModel(); });
}
loadModel().then(() => {
  const m = location.hash.match(/^#ask=([^&]*)(&stop)?$/);
  if (m) { stopEarly = !!m[2]; send(decodeURIComponent(m[1])); }
});
</script>
</body>
</html>
)HTML";

}  // namespace

std::string_view chat_page_html() {
  return kPage;
}

}  // namespace ms::server
