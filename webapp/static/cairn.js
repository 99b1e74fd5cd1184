// Small behaviours htmx does not cover: Enter sends (Shift+Enter is a newline), keep the newest message in view.
document.addEventListener("keydown", (event) => {
  const box = event.target;
  if (box.matches?.("#composer textarea") && event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    if (box.value.trim()) htmx.trigger(box.form, "submit");
  }
});

function scrollMessagesToEnd() {
  const list = document.getElementById("messages");
  if (list) list.scrollTop = list.scrollHeight;
}

document.addEventListener("DOMContentLoaded", scrollMessagesToEnd);
document.addEventListener("htmx:afterSwap", (event) => {
  if (event.detail.target.id === "messages") scrollMessagesToEnd();
});
document.addEventListener("htmx:sseMessage", scrollMessagesToEnd);
