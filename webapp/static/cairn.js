// Small behaviours htmx does not cover, for the chat page first: the composer keeps the focus and clears what it
// sent, Enter sends (Shift+Enter is a newline), @ suggests agent names, the newest message stays in view, new
// replies are announced to screen readers, copy buttons, local times, confirmations.

const composerInput = () => document.getElementById("composer-input");

function focusComposer() {
  const box = composerInput();
  if (box && !box.disabled) box.focus({ preventScroll: true });
}

function growComposer(box) {
  box.style.height = "auto";
  box.style.height = `${Math.min(box.scrollHeight + 2, window.innerHeight * 0.4)}px`;
}

// --- sending -------------------------------------------------------------------------------------------------
let sentText = null;

document.addEventListener("htmx:beforeRequest", (event) => {
  if (event.detail.elt.id === "composer") sentText = composerInput()?.value ?? null;
});

document.addEventListener("htmx:afterRequest", (event) => {
  if (event.detail.elt.id !== "composer") return;
  const box = composerInput();
  const sent = event.detail.xhr && event.detail.xhr.status >= 200 && event.detail.xhr.status < 300;
  if (sent && box && box.value === sentText) {  // not on a refusal (422, 429): the draft stays
    box.value = "";  // cleared only if nothing was typed meanwhile
    growComposer(box);
  }
  focusComposer();
});

document.addEventListener("keydown", (event) => {
  const box = event.target;
  if (!box.matches?.("#composer-input")) return;
  if (mentionKeydown(event, box)) return;
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    if (box.value.trim()) htmx.trigger(box.form, "submit");
  }
});

document.addEventListener("input", (event) => {
  if (event.target.matches?.("#composer-input")) {
    growComposer(event.target);
    showMentions(event.target);
  }
});

// --- @ autocomplete ------------------------------------------------------------------------------------------
function mentionQuery(box) {
  const before = box.value.slice(0, box.selectionStart);
  const match = before.match(/(^|\s)@([\w .'-]{0,40})$/);
  return match ? { start: before.length - match[2].length - 1, text: match[2].toLowerCase() } : null;
}

function mentionList() {
  let list = document.getElementById("mentions");
  if (!list) {
    list = document.createElement("ul");
    list.id = "mentions";
    list.className = "mentions";
    list.setAttribute("aria-label", "Agents");
    composerInput().closest(".compose-row").append(list);
  }
  return list;
}

function hideMentions() {
  document.getElementById("mentions")?.remove();
}

function showMentions(box) {
  const names = (box.dataset.agents || "").split("|").filter(Boolean);
  const query = mentionQuery(box);
  const matches = query ? names.filter((n) => n.toLowerCase().startsWith(query.text)) : [];
  if (names.length < 2 || !matches.length || (matches.length === 1 && matches[0].toLowerCase() === query.text)) {
    hideMentions();
    return;
  }
  const list = mentionList();
  list.replaceChildren(...matches.map((name, i) => {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = `@${name}`;
    button.dataset.name = name;
    if (i === 0) button.classList.add("active");
    button.addEventListener("mousedown", (e) => e.preventDefault());  // keep the focus in the composer
    button.addEventListener("click", () => insertMention(box, name));
    item.append(button);
    return item;
  }));
}

function insertMention(box, name) {
  const query = mentionQuery(box);
  if (!query) return;
  const after = box.value.slice(box.selectionStart);
  box.value = `${box.value.slice(0, query.start)}@${name} ${after}`;
  const caret = query.start + name.length + 2;
  box.setSelectionRange(caret, caret);
  hideMentions();
  box.focus();
}

function mentionKeydown(event, box) {
  const list = document.getElementById("mentions");
  if (!list) return false;
  const buttons = [...list.querySelectorAll("button")];
  const active = buttons.findIndex((b) => b.classList.contains("active"));
  if (event.key === "ArrowDown" || event.key === "ArrowUp") {
    const next = (active + (event.key === "ArrowDown" ? 1 : buttons.length - 1)) % buttons.length;
    buttons.forEach((b, i) => b.classList.toggle("active", i === next));
  } else if (event.key === "Enter" || event.key === "Tab") {
    insertMention(box, buttons[Math.max(active, 0)].dataset.name);
  } else if (event.key === "Escape") {
    hideMentions();
  } else {
    return false;
  }
  event.preventDefault();
  return true;
}

// --- the message pane ----------------------------------------------------------------------------------------
function nearEnd(list) {
  return list.scrollHeight - list.scrollTop - list.clientHeight < 160;
}

let followEnd = true;
function scrollMessagesToEnd() {
  const list = document.getElementById("messages");
  if (list && followEnd) list.scrollTop = list.scrollHeight;
}

document.addEventListener("scroll", (event) => {
  if (event.target.id === "messages") followEnd = nearEnd(event.target);
}, true);

// Messages from other people (and other tabs) arrive on the stream as "message"; skip ones already shown.
document.addEventListener("htmx:sseBeforeMessage", (event) => {
  if (event.detail.type !== "message") return;
  const id = event.detail.data.match(/id="(message-\d+)"/)?.[1];
  if (!id || document.getElementById(id)) event.preventDefault();
});

// A reply can reach the page on the stream before the response that created it: the response's copy wins.
document.addEventListener("htmx:beforeSwap", (event) => {
  const html = event.detail.serverResponse;
  if (typeof html !== "string" || !html.includes('<article id="message-')) return;
  for (const [, id] of html.matchAll(/<article id="(message-\d+)"/g)) {
    const shown = document.getElementById(id);
    if (shown && shown !== event.detail.target) shown.remove();
  }
});

function removeDuplicates() {
  const seen = new Set();
  document.querySelectorAll("#messages > article[id]").forEach((article) => {
    if (seen.has(article.id)) article.remove();
    seen.add(article.id);
  });
}

// Edit is offered on your own message only while nothing but replies follow it (and notices, which are no turn).
function markEditable() {
  const articles = [...document.querySelectorAll("#messages > article.message")];
  articles.forEach((a) => a.classList.remove("editable"));
  const lastNonReply = articles.filter((a) => !a.classList.contains("assistant") && !a.classList.contains("system")).pop();
  if (lastNonReply?.classList.contains("mine")) lastNonReply.classList.add("editable");
}

function announce(element) {
  const announcer = document.getElementById("announcer");
  if (!announcer || !element.dataset?.announce) return;
  const text = element.querySelector(".body")?.innerText ?? "";
  announcer.textContent = `${element.dataset.announce} ${text.slice(0, 300)}`;
}

// --- copy ----------------------------------------------------------------------------------------------------
async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const area = Object.assign(document.createElement("textarea"), { value: text });
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  const label = [...button.childNodes];  // its words back afterwards, a visually hidden part kept hidden
  button.textContent = "Copied";
  setTimeout(() => button.replaceChildren(...label), 1500);
}

document.addEventListener("click", (event) => {
  const button = event.target.closest?.("[data-copy], .copy-code");
  if (!button) return;
  const source = button.matches(".copy-code") ? button.parentElement.querySelector("code, pre")
    : document.querySelector(button.dataset.copy);
  if (source) copyText(source.matches("textarea, input") ? source.value : source.innerText, button);
});

function addCodeCopyButtons(root) {
  root.querySelectorAll?.(".message .body:not(.streaming) pre").forEach((pre) => {
    if (pre.parentElement.classList.contains("code-block")) return;
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    pre.replaceWith(wrap);
    const button = Object.assign(document.createElement("button"), { type: "button", className: "copy-code", textContent: "Copy code" });
    wrap.append(button, pre);
  });
}

// --- times ---------------------------------------------------------------------------------------------------
const relative = new Intl.RelativeTimeFormat(undefined, { numeric: "auto", style: "short" });
function localTimes(root) {
  const now = Date.now();
  root.querySelectorAll?.("time[data-relative]").forEach((time) => {
    const seconds = (new Date(time.dateTime) - now) / 1000;
    const [unit, size] = [["day", 86400], ["hour", 3600], ["minute", 60]].find(([, s]) => Math.abs(seconds) >= s) || ["second", 1];
    time.textContent = Math.abs(seconds) < 60 ? "just now" : relative.format(Math.round(seconds / size), unit);
    time.title = new Date(time.dateTime).toLocaleString();
  });
  root.querySelectorAll?.("time[data-clock]").forEach((time) => {
    const when = new Date(time.dateTime);
    const today = new Date().toDateString() === when.toDateString();
    const clock = when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    time.textContent = today ? clock : `${when.toLocaleDateString([], { month: "short", day: "numeric" })}, ${clock}`;
    time.title = when.toLocaleString();
  });
}

// --- confirmations and the details panel ---------------------------------------------------------------------
document.addEventListener("submit", (event) => {
  const question = event.target.dataset?.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
}, true);

document.addEventListener("click", (event) => {
  const toggle = event.target.closest?.(".info-toggle");
  if (!toggle) return;
  const open = document.body.classList.toggle("info-open");
  document.querySelectorAll(".info-toggle").forEach((b) => b.setAttribute("aria-expanded", String(open)));
  if (open) document.getElementById("chat-info")?.focus();
});

// --- wiring --------------------------------------------------------------------------------------------------
function refresh(root) {
  localTimes(root);
  addCodeCopyButtons(root);
  removeDuplicates();
  markEditable();
}

document.addEventListener("DOMContentLoaded", () => {
  refresh(document);
  scrollMessagesToEnd();
  const box = composerInput();
  if (box) { growComposer(box); focusComposer(); }
});

document.addEventListener("htmx:load", (event) => {
  refresh(event.detail.elt);
  if (document.readyState === "complete") announce(event.detail.elt);
  // A message added or changed: the chat list beside it refreshes its preview and time (#side-list).
  if (document.readyState === "complete" && event.detail.elt.matches?.("article.message")) {
    htmx.trigger(document.body, "chat-changed");
    // It borrowed another conversation: the panel (#cross-conversations) shows that now, not at its next poll.
    if (event.detail.elt.querySelector(".step.done[data-tool='borrow_context']")) {
      htmx.trigger(document.body, "context-borrowed");
    }
  }
});

document.addEventListener("htmx:afterSettle", (event) => {
  if (event.detail.elt.closest?.("#messages") || event.detail.elt.id === "messages") scrollMessagesToEnd();
  if (event.detail.elt.id === "composer" || event.detail.elt.closest?.("#composer")) focusComposer();
});
document.addEventListener("htmx:sseMessage", scrollMessagesToEnd);
setInterval(() => localTimes(document), 60_000);

// --- code highlighting (vendor/highlight-*.min.js) -----------------------------------------------------------
// A finished message's fenced blocks are coloured once, by the language the server kept on <code>. A streaming
// body is replaced at every delta, so it is left alone: the final message that replaces it gets highlighted.
function highlightCode(root) {
  if (!window.hljs) return;
  root.querySelectorAll?.("pre > code[class^='language-']:not([data-highlighted])").forEach((code) => {
    if (code.closest(".body.streaming")) return;
    const language = code.className.slice("language-".length);
    if (window.hljs.getLanguage(language)) window.hljs.highlightElement(code);
  });
}
document.addEventListener("DOMContentLoaded", () => highlightCode(document));
document.addEventListener("htmx:load", (event) => highlightCode(event.detail.elt));
document.addEventListener("htmx:afterSettle", (event) => highlightCode(event.detail.elt));

// A model picker (the agent form, the background model): picking a listed model clears an id typed beside it,
// which would otherwise look as if it applied; "Another model at ..." (a value ending in "|") asks for one.
document.addEventListener("change", (event) => {
  const picker = event.target.closest("select[data-typed-model]");
  if (!picker) return;
  const typed = document.getElementById(picker.dataset.typedModel);
  if (!typed) return;
  if (picker.value.endsWith("|")) typed.focus();
  else typed.value = "";
});

// A notice (webapp.web.guards.notice: HX-Retarget #notice) is shown whatever its status: a refusal, a chat one may
// no longer read, a server error. Other error responses are not swapped (base.html's htmx-config).
document.addEventListener("htmx:beforeSwap", (event) => {
  if (event.detail.xhr.getResponseHeader("HX-Retarget") !== "#notice") return;
  event.detail.shouldSwap = true;
  event.detail.isError = false;
});

// After an invalid form (a page or a fragment re-rendered with its errors, _field.html), the focus moves to the
// first field in error, where a screen reader reads the error too (aria-describedby), not to the page's top.
function focusFirstError(root) {
  const field = root.querySelector?.(".field.invalid :is(input:not([type=hidden]), select, textarea)");
  if (field) field.focus();
}
// On load: a URL's #fragment (the key form's action) takes the focus back to the page when it scrolls there.
window.addEventListener("load", () => focusFirstError(document));
document.addEventListener("htmx:afterSettle", (event) => focusFirstError(event.detail.elt));

// Something to pass on (a sign-in link, a new API key) is selected whole when it gets the focus, by a tap or the
// keyboard, so it can be copied on a phone without picking the text out of the box.
function selectWhole(event) {
  if (event.target.matches?.("[data-select-on-focus]")) event.target.select();
}
document.addEventListener("focusin", selectWhole);
document.addEventListener("click", selectWhole);  // the click that focused it would otherwise place the caret
