/**
 * An incremental `text/event-stream` decoder (the WHATWG format), the twin of the Python SDK's
 * sdk/_sse.py. Feed it bytes exactly as they come; chunks may split anything (a UTF-8
 * sequence, a CRLF pair, a field name). No I/O.
 */

export interface ServerSentEvent {
  event: string;
  data: string;
  id: string | undefined;
  retry: number | undefined;
}

const EOL = /\r\n|\r|\n/g;

export class SSEDecoder {
  private readonly text = new TextDecoder("utf-8");
  private buffer = "";
  private afterCr = false;
  private started = false;
  private event = "";
  private data: string[] = [];
  private id: string | undefined;
  private retry: number | undefined;

  /** Decode one chunk; the events it completed (possibly none). */
  feed(chunk: Uint8Array): ServerSentEvent[] {
    return this.feedText(this.text.decode(chunk, { stream: true }));
  }

  /** End of stream. A final event without its blank line is dispatched anyway: a truncated
   * last event still carries information (the Python decoder does the same). */
  close(): ServerSentEvent[] {
    const events = this.feedText(this.text.decode());
    if (this.buffer) {
      const line = this.buffer;
      this.buffer = "";
      this.line(line, events);
    }
    this.dispatch(events);
    return events;
  }

  private feedText(input: string): ServerSentEvent[] {
    const events: ServerSentEvent[] = [];
    let text = input;
    if (!text) return events;
    if (!this.started) {
      this.started = true;
      if (text.startsWith("\ufeff")) text = text.slice(1);
    }
    if (this.afterCr) {
      this.afterCr = false;
      if (text.startsWith("\n")) text = text.slice(1);
    }
    const buf = this.buffer + text;
    let pos = 0;
    for (const match of buf.matchAll(EOL)) {
      const start = match.index ?? 0;
      this.line(buf.slice(pos, start), events);
      pos = start + match[0].length;
      if (match[0] === "\r" && pos === buf.length) this.afterCr = true;
    }
    this.buffer = buf.slice(pos);
    return events;
  }

  private line(line: string, events: ServerSentEvent[]): void {
    if (!line) {
      this.dispatch(events);
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id") {
      if (!value.includes("\0")) this.id = value;
    } else if (name === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
  }

  private dispatch(events: ServerSentEvent[]): void {
    if (this.data.length) {
      events.push({ event: this.event || "message", data: this.data.join("\n"), id: this.id,
        retry: this.retry });
    }
    this.event = "";
    this.data = [];
    this.retry = undefined;
  }
}
