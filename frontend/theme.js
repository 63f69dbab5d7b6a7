export const THEME_EVENT = "torchscope-theme";

// Light / dark theme: follows the system unless the user picked one (kept in localStorage).
export function initTheme() {
  const saved = localStorage.getItem("torchscope-theme");
  const dark = saved ? saved === "dark" : window.matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  const btn = document.getElementById("theme");
  if (!btn) return;
  // a toggle whose state is said: "dark theme, pressed" (its glyph, "◐", said nothing of it)
  const say = () => btn.setAttribute("aria-pressed", String(document.documentElement.dataset.theme === "dark"));
  btn.setAttribute("aria-label", "dark theme");
  say();
  btn.addEventListener("click", () => {
    const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    say();
    localStorage.setItem("torchscope-theme", next);
    window.dispatchEvent(new Event(THEME_EVENT)); // canvases repaint with the new colours
  });
}
