// A browser terminal on the PTY WebSocket (docs/adr/0028-terminals.md), drawn by xterm.js
// (vendor/, loaded as a classic script: window.Terminal, window.FitAddon).
import {api, h, notify} from "./api.js";

const MAX_INPUT = 64 * 1024;  // the server closes with 1009 past this: a paste is cut

export function terminalPanel(id) {
  let term = null, socket = null, fit = null, pid = null, onResize = null;
  const screen = h("div", {class: "terminal", hidden: true});
  const state = h("span", {class: "sub", role: "status"});
  const open = h("button", {type: "button", id: "open-terminal", onclick: () => start()},
                 "Open terminal");
  const close = h("button", {type: "button", class: "secondary", hidden: true,
                             onclick: () => stop(true)}, "Close");
  const hint = h("p", {class: "hint", hidden: true}, "Ctrl+] leaves the terminal for the page.");
  const element = h("section", {"aria-labelledby": "term-h"},
    h("div", {class: "section-head"}, h("h2", {id: "term-h"}, "Terminal"), state, open, close),
    screen, hint);

  async function stop(kill) {
    if (onResize) window.removeEventListener("resize", onResize);
    onResize = null;
    // Closing the socket only detaches (the shell runs on, ADR 0028): Close ends the shell
    // first, as closing a terminal window does (SIGHUP), then detaches.
    if (kill && pid !== null && socket && socket.readyState === WebSocket.OPEN) {
      await api("POST", `/v1/sandboxes/${id}/processes/${pid}/signal`, {body: {signal: 1}})
        .catch((e) => notify(`Terminal: ${e.message}`, "error"));
    }
    if (socket) socket.close(1000);
    socket = null;
    pid = null;
    if (term) term.dispose();
    term = null;
    screen.hidden = true;
    hint.hidden = true;
    open.hidden = false;
    close.hidden = true;
  }

  async function start() {
    open.hidden = true;
    close.hidden = false;
    screen.hidden = false;
    hint.hidden = false;
    term = new window.Terminal({cursorBlink: true, fontSize: 14, convertEol: false,
                                scrollback: 5000});
    fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(screen);
    fit.fit();
    try {
      const info = await api("POST", `/v1/sandboxes/${id}/pty`,
                             {body: {cols: term.cols, rows: term.rows}});
      pid = info.pid;
    } catch (e) {
      notify(`Terminal: ${e.message}`, "error");
      stop(false);
      return;
    }
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    socket = new WebSocket(`${scheme}//${location.host}/dashboard/api/v1/sandboxes/` +
                           `${encodeURIComponent(id)}/pty/${pid}`);
    socket.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    // Keys typed while the socket still connects are kept and sent on open, in order, so
    // that typeahead is never lost (a slow host can take seconds to open it).
    let pending = [];
    const send = (bytes) => {
      for (let i = 0; i < bytes.length; i += MAX_INPUT) {
        socket.send(bytes.subarray(i, i + MAX_INPUT));
      }
    };
    socket.onopen = () => {
      for (const bytes of pending) send(bytes);
      pending = [];
      state.textContent = `pid ${pid}`;
      term.focus();
    };
    socket.onmessage = (event) => {
      if (typeof event.data === "string") {
        const message = JSON.parse(event.data);
        if (message.type === "exit") {
          term.write(`\r\n[exited: ${message.signal ? "signal " + message.signal
                                                     : message.exit_code}]\r\n`);
          state.textContent = "exited";
        }
        return;
      }
      term.write(new Uint8Array(event.data));
    };
    socket.onclose = (event) => {
      if (event.code !== 1000 && term) {
        term.write(`\r\n[disconnected: ${event.code}]\r\n`);
        state.textContent = "disconnected";
      }
    };
    // The terminal takes Tab and Shift+Tab (the shell needs them): Ctrl+] is the way out
    // for a keyboard, as in telnet.
    term.attachCustomKeyEventHandler((event) => {
      if (event.type === "keydown" && event.ctrlKey && event.key === "]") {
        close.focus();
        return false;
      }
      return true;
    });
    term.onData((data) => {
      if (!socket) return;
      const bytes = encoder.encode(data);
      if (socket.readyState === WebSocket.CONNECTING) {
        if (pending.reduce((n, b) => n + b.length, 0) + bytes.length <= MAX_INPUT) {
          pending.push(bytes);
        }
        return;
      }
      if (socket.readyState === WebSocket.OPEN) send(bytes);
    });
    term.onResize(({cols, rows}) => {
      if (socket && socket.readyState === WebSocket.OPEN) {
        socket.send(JSON.stringify({type: "resize", cols, rows}));
      }
    });
    onResize = () => fit && fit.fit();
    window.addEventListener("resize", onResize);
  }

  return {
    element,
    stop: () => stop(false),
    setState(sandboxState) {
      open.disabled = sandboxState !== "running";
      open.title = open.disabled ? `The sandbox is ${sandboxState}` : "";
    },
  };
}
