// Webhooks: check that a request came from the service (its signature), and read its payload.
//
// The service signs every webhook (and every tool call) with the tenant's signing secret:
// `Subagent-Timestamp: <unix seconds>` and `Subagent-Signature: v1=<hex HMAC-SHA256 of
// "<timestamp>.<body>">`. Web Crypto: Node ≥ 20 and browsers alike.
/** The request is not signed by the service with this secret (or is too old). */
export class WebhookVerificationError extends Error {
}
function header(h, name) {
    if (typeof h.get === "function")
        return h.get(name) ?? undefined;
    for (const [k, v] of Object.entries(h)) {
        if (k.toLowerCase() === name)
            return Array.isArray(v) ? v[0] : v;
    }
    return undefined;
}
const hex = (b) => Array.from(new Uint8Array(b), (x) => x.toString(16).padStart(2, "0")).join("");
function bytes(body) {
    if (typeof body === "string")
        return new TextEncoder().encode(body);
    return body instanceof Uint8Array ? body : new Uint8Array(body);
}
function equal(a, b) {
    if (a.length !== b.length)
        return false;
    let d = 0;
    for (let i = 0; i < a.length; i++)
        d |= a.charCodeAt(i) ^ b.charCodeAt(i);
    return d === 0;
}
/**
 * Throw `WebhookVerificationError` unless `body` (its bytes as received) was signed with `secret`
 * within `toleranceSeconds`.
 */
export async function verify(secret, headers, body, toleranceSeconds = 300) {
    const ts = header(headers, "subagent-timestamp");
    const sig = header(headers, "subagent-signature");
    if (!ts || !sig)
        throw new WebhookVerificationError("no Subagent-Timestamp or Subagent-Signature header");
    const when = Number(ts);
    if (!Number.isInteger(when))
        throw new WebhookVerificationError("Subagent-Timestamp is not a number");
    if (toleranceSeconds && Math.abs(Date.now() / 1000 - when) > toleranceSeconds) {
        throw new WebhookVerificationError("the signature is too old (or from the future)");
    }
    const key = await crypto.subtle.importKey("raw", new TextEncoder().encode(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
    const raw = bytes(body);
    const signed = new Uint8Array(ts.length + 1 + raw.length);
    signed.set(new TextEncoder().encode(`${when}.`), 0);
    signed.set(raw, ts.length + 1);
    const want = "v1=" + hex(await crypto.subtle.sign("HMAC", key, signed));
    if (!sig.split(",").some((s) => equal(s.trim(), want)))
        throw new WebhookVerificationError("the signature does not match");
}
/** Read a webhook's payload (check it with `verify` first). */
export function parse(body) {
    return JSON.parse(typeof body === "string" ? body : new TextDecoder().decode(bytes(body)));
}
/** `verify`, then `parse`. */
export async function constructEvent(secret, headers, body, toleranceSeconds = 300) {
    await verify(secret, headers, body, toleranceSeconds);
    return parse(body);
}
