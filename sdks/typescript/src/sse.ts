/** A Server-Sent Events reader for the task event stream: the parts of the format the
 * service uses (`id`, `event`, `data` and comment lines). */

import { isObject } from "./errors.js";
import type { Prediction, TaskEvent } from "./models.js";

export class SSEDecoder {
  private id: string | undefined;
  private event = "message";
  private data: string[] = [];

  /** Feed one line; an event comes back at the blank line that ends it. */
  feed(raw: string): TaskEvent | undefined {
    const line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "id") this.id = value;
    else if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    return undefined;
  }

  private dispatch(): TaskEvent | undefined {
    const event = this.event;
    const text = this.data.join("\n");
    const had = this.data.length > 0;
    this.data = [];
    this.event = "message";
    if (!had) return undefined;
    let data: unknown;
    try {
      data = JSON.parse(text);
    } catch {
      return undefined;
    }
    if (!isObject(data)) return undefined;
    return { id: this.id ?? "", event, prediction: data as unknown as Prediction };
  }
}
