/**
 * The claim check: a payload or result too large to travel inline is kept in the JetStream
 * Object Store (bucket `<prefix>_payloads`) and the envelope carries a `PayloadRef` instead
 * (bucket, name, size, SHA-256). Every reader checks the SHA-256 before it uses what it got.
 * An agent reads a task's `payload_ref`, and stows a result above its threshold (256 KiB by
 * default) as `<message_id>/<attempt>/result`; a caller stows a payload above it as
 * `<message_id>/payload-<first 16 hex of its SHA-256>` and reads a `result_ref` — as the
 * Python SDK does. A secured server
 * grants no Object Store: there, payloads and results must fit in a message.
 */

import { createHash } from "node:crypto";
import type { JetStreamClient, ObjectStore } from "nats";

import { decodeJson, encode } from "./codec.js";
import { ReachError } from "./errors.js";
import type { PayloadRef, Task } from "./types.js";

/** Payloads and results whose JSON is larger than this many bytes go to the Object Store. */
export const DEFAULT_CLAIM_CHECK_BYTES = 262_144;

/** A claim-checked payload is gone (expired, deleted) or does not match its digest. */
export class PayloadUnavailable extends ReachError {
  override name = "PayloadUnavailable";
}

export class ClaimCheck {
  private readonly stores = new Map<string, Promise<ObjectStore>>();

  constructor(
    private readonly js: JetStreamClient,
    private readonly bucket: string,
    readonly thresholdBytes: number = DEFAULT_CLAIM_CHECK_BYTES,
  ) {}

  /** The task's payload, fetched from the store when it was claim-checked. */
  async payloadOf(task: Task): Promise<unknown> {
    if (task.payload_ref === null || task.payload_ref === undefined) return task.payload;
    return decodeJson(await this.get(task.payload_ref));
  }

  /** `task` with a large payload replaced by a reference (else `task` itself). */
  async stowTask(task: Task): Promise<Task> {
    if (task.payload_ref !== null || task.payload === null || task.payload === undefined) return task;
    const data = encode(task.payload);
    if (data.length <= this.thresholdBytes) return task;
    // Named by its content too: the same id sent again with another payload (refused as
    // another request) must not replace the bytes the first one's agent is to read.
    const name = `${task.message_id}/payload-${sha256(data).slice(0, 16)}`;
    return { ...task, payload: null, payload_ref: await this.put(name, data) };
  }

  /** A result, fetched from the store when it was claim-checked. */
  async resultOf(result: unknown, ref: PayloadRef | null): Promise<unknown> {
    return ref === null ? result : decodeJson(await this.get(ref));
  }

  /** `[result, null]` when small enough to travel, else `[null, reference]`. */
  async stowResult(task: Task, result: unknown): Promise<[unknown, PayloadRef | null]> {
    const data = encode(result ?? null);
    if (data.length <= this.thresholdBytes) return [result ?? null, null];
    return [null, await this.put(`${task.message_id}/${task.attempt}/result`, data)];
  }

  /** Store `data` as `name` (the same name again stores the same bytes: idempotent). */
  async put(name: string, data: Uint8Array): Promise<PayloadRef> {
    const store = await this.store(this.bucket);
    await store.putBlob({ name }, data);
    return { bucket: this.bucket, name, size: data.length, sha256: sha256(data) };
  }

  /** The bytes `ref` names, checked against its SHA-256. */
  async get(ref: PayloadRef): Promise<Uint8Array> {
    const where = `${ref.bucket}/${ref.name}`;
    if (ref.bucket !== this.bucket) {
      // a sender's reference is not read from just any bucket
      throw new PayloadUnavailable(`${where}: claim checks are kept in the Object Store bucket ${this.bucket}, not ${ref.bucket}`);
    }
    const store = await this.store(ref.bucket);
    const found = await store.get(ref.name);
    if (found === null) throw new PayloadUnavailable(`${where} is no longer stored`);
    let data: Uint8Array;
    try {
      data = await readAll(found.data);
    } catch {
      throw new PayloadUnavailable(`${where} is damaged`); // the store's own digest failed
    }
    if (sha256(data) !== ref.sha256) throw new PayloadUnavailable(`${where} does not match its SHA-256`);
    return data;
  }

  private store(bucket: string): Promise<ObjectStore> {
    let store = this.stores.get(bucket);
    if (store === undefined) {
      store = this.js.views.os(bucket);
      store.catch(() => this.stores.delete(bucket)); // try again next time
      this.stores.set(bucket, store);
    }
    return store;
  }
}

function sha256(data: Uint8Array): string {
  return createHash("sha256").update(data).digest("hex");
}

async function readAll(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
  }
  return Buffer.concat(chunks);
}
