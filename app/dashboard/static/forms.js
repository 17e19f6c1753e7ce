// A form sent back with an error may sit below the fold, with nothing in view saying so:
// bring its first invalid field to the middle of the window and focus it, so the error
// beside it is seen, and read out (the field is described by its error).
document.addEventListener("DOMContentLoaded", () => {
  const invalid = document.querySelector('[aria-invalid="true"]');
  if (!invalid) return;
  invalid.scrollIntoView({ block: "center" });
  invalid.focus({ preventScroll: true });
});
