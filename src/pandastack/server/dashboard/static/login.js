// Sign-in: the key goes to the server once, as JSON from this origin; the answer sets the
// session cookie (HttpOnly: no script, this one included, can read it).
const form = document.getElementById("login-form");
const error = document.getElementById("login-error");

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  error.hidden = true;
  const key = document.getElementById("key").value.trim();
  let response;
  try {
    response = await fetch("/dashboard/login", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({key}),
      credentials: "same-origin",
    });
  } catch (e) {
    error.textContent = "The server did not answer.";
    error.hidden = false;
    return;
  }
  if (response.ok) {
    location.assign("/dashboard/");
    return;
  }
  let message = `Sign-in failed (${response.status}).`;
  try {
    const body = await response.json();
    if (body.error) message = body.error.message;
  } catch (e) { /* not JSON: keep the status */ }
  error.textContent = message;
  error.hidden = false;
});
