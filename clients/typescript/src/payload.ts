// Job payloads: JSON by default, raw bytes when the caller passes bytes.

/** Kinds to payload types, e.g. `{ "send-email": { order: string; to: string } }`. */
export type KindMap = Record<string, unknown>;

/** Any kind, any payload: the default when no KindMap is given. */
export type AnyKinds = Record<string, unknown>;

const encoder = new TextEncoder();

/**
 * The bytes a handler's result is stored as: a Uint8Array as is, a string
 * as its UTF-8 text, `undefined` or `null` as none (empty), anything else
 * as its JSON text.
 */
export function encodeResult(value: unknown): Uint8Array {
  if (value === undefined || value === null) return new Uint8Array();
  if (typeof value === "string") return encoder.encode(value);
  return encodePayload(value);
}

/**
 * The bytes a payload is sent as: a Uint8Array (a Buffer too) as is,
 * `undefined` as empty, anything else as its JSON text (UTF-8).
 */
export function encodePayload(payload: unknown): Uint8Array {
  if (payload instanceof Uint8Array) return payload;
  if (payload === undefined) return new Uint8Array();
  const text = JSON.stringify(payload);
  if (text === undefined) {
    throw new TypeError(`a payload of type ${typeof payload} has no JSON form; pass a Uint8Array for raw bytes`);
  }
  return encoder.encode(text);
}
