// The copy buttons: shown only where the clipboard can be written, since every other
// action of the dashboard works without scripts.
document.addEventListener("DOMContentLoaded", () => {
  if (!navigator.clipboard) return;
  for (const button of document.querySelectorAll("button.copy[data-copy-target]")) {
    button.hidden = false;
    button.addEventListener("click", async () => {
      const target = document.getElementById(button.dataset.copyTarget);
      const text = "value" in target && target.tagName === "INPUT" ? target.value : target.textContent;
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
      } catch {
        if (target.select) target.select();
        button.textContent = "Press Ctrl+C";
      }
      setTimeout(() => { button.textContent = "Copy"; }, 2000);
    });
  }
});
