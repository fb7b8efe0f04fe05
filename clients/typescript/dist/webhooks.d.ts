import type { Task } from "./models.js";
/** The request is not signed by the service with this secret (or is too old). */
export declare class WebhookVerificationError extends Error {
}
type HeaderBag = Headers | Record<string, string | string[] | undefined>;
/**
 * Throw `WebhookVerificationError` unless `body` (its bytes as received) was signed with `secret`
 * within `toleranceSeconds`.
 */
export declare function verify(secret: string, headers: HeaderBag, body: string | Uint8Array | ArrayBuffer, toleranceSeconds?: number): Promise<void>;
/** A webhook's payload. */
export interface WebhookEvent {
    event: "task.finished" | "task.requires_action" | string;
    task: Task;
    pause?: number;
    actions?: Record<string, unknown>[];
    [field: string]: unknown;
}
/** Read a webhook's payload (check it with `verify` first). */
export declare function parse(body: string | Uint8Array | ArrayBuffer): WebhookEvent;
/** `verify`, then `parse`. */
export declare function constructEvent(secret: string, headers: HeaderBag, body: string | Uint8Array | ArrayBuffer, toleranceSeconds?: number): Promise<WebhookEvent>;
export {};
