/**
 * Exposed ports in Docker's form ("8080/tcp"): a port of src/pandastack/templatespec/ports.py
 * (a Dockerfile's `EXPOSE`, the builder's `expose`, the spec's `exposed_ports`).
 */
import { pyRepr } from "./template.js";

export const MAX_EXPOSED_PORTS = 1024;
const PROTOCOLS = ["tcp", "udp", "sctp"];
const PORT_RE = /^([0-9]{1,5})(?:-([0-9]{1,5}))?(?:\/([A-Za-z]+))?$/;
const FORMS = "a port (8080), a port and protocol (53/udp: tcp, udp or sctp) or a range (8000-8010)";

function parse(value: string): [number, number, string] {
  const found = PORT_RE.exec(value);
  if (found === null) throw new Error(`${pyRepr(value)} is not ${FORMS}`);
  const first = Number(found[1]);
  const last = found[2] === undefined ? first : Number(found[2]);
  const protocol = (found[3] ?? "tcp").toLowerCase(); // Docker lowercases it too
  if (!PROTOCOLS.includes(protocol)) {
    throw new Error(`${pyRepr(value)}: the protocol is tcp, udp or sctp, not ${pyRepr(protocol)}`);
  }
  if (!(first >= 1 && first <= 65535 && last >= 1 && last <= 65535)) throw new Error(`${pyRepr(value)}: a port is 1-65535`);
  if (last < first) throw new Error(`${pyRepr(value)}: the range ends before it starts`);
  if (last - first >= MAX_EXPOSED_PORTS) throw new Error(`${pyRepr(value)}: more than ${MAX_EXPOSED_PORTS} ports`);
  return [first, last, protocol];
}

/** What Docker's `EXPOSE` makes of one word: `8080` and `8080/TCP` are `8080/tcp`, a range
 * `8000-8002/udp` each of its ports. */
export function exposePorts(value: number | string): string[] {
  if (typeof value !== "string" && !(typeof value === "number" && Number.isInteger(value))) {
    throw new Error(`${String(value)} is not a port`);
  }
  const [first, last, protocol] = parse(String(value));
  const ports: string[] = [];
  for (let port = first; port <= last; port++) ports.push(`${port}/${protocol}`);
  return ports;
}

/** One port of a spec's `exposed_ports`, in Docker's form (`8080` becomes `8080/tcp`). */
export function exposedPort(value: string): string {
  const ports = exposePorts(value);
  if (ports.length !== 1) throw new Error(`${pyRepr(value)}: one port, not a range`);
  return ports[0]!;
}

/** In the order first written, each once. */
export function unique(ports: Iterable<string>): string[] {
  return [...new Set(ports)];
}
