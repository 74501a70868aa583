// Asking for the API key: the modal dialog shown at first visit, when the key is refused, and from
// the "API key" button. The key itself is kept by api.js (sessionStorage).

import { $ } from "./dom.js";

export function askForKey(error = "") {
  const dialog = $("key-dialog");
  $("key-error").textContent = error;
  $("key-input").value = "";
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
}
