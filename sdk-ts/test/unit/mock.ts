// A scripted `fetch`: each request goes to the handler, which answers with a Response; every
// request is recorded so tests can check what was sent.
export interface Sent {
  method: string;
  url: URL;
  headers: Headers;
  body: string | undefined;
}

export type Handler = (req: Sent) => Response | Promise<Response>;

export function mockFetch(handler: Handler): { fetch: typeof globalThis.fetch; sent: Sent[] } {
  const sent: Sent[] = [];
  const fetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(String(input));
    let body: string | undefined;
    const raw = init?.body;
    if (typeof raw === "string") body = raw;
    else if (raw instanceof Uint8Array) body = new TextDecoder().decode(raw);
    else if (raw instanceof ReadableStream) body = await new Response(raw).text();
    else if (raw && typeof raw === "object" && Symbol.asyncIterator in raw) {
      const parts: Uint8Array[] = [];
      for await (const part of raw as AsyncIterable<Uint8Array>) parts.push(part);
      body = Buffer.concat(parts).toString("utf8");
    }
    const req = { method: init?.method ?? "GET", url, headers: new Headers(init?.headers), body };
    sent.push(req);
    return handler(req);
  };
  return { fetch: fetch as typeof globalThis.fetch, sent };
}

export function json(status: number, data: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(data), { status, headers: { "content-type": "application/json", ...headers } });
}

/** A text/event-stream body delivered in the chunks given (each split where the test says). */
export function sse(chunks: string[]): Response {
  const enc = new TextEncoder();
  const stream = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const c of chunks) controller.enqueue(enc.encode(c));
      controller.close();
    },
  });
  return new Response(stream, { status: 200, headers: { "content-type": "text/event-stream" } });
}

export const SANDBOX = {
  id: "sbx-1", state: "running", template: "base", vcpus: 1, memory_mb: 512, created_at: 1,
  persistent: false, metadata: { role_name: "worker" },
};

export const OPTS = { apiUrl: "http://api.test", apiKey: "k-1" };
