/**
 * What the panel knows about one kernel, and the one place kernel messages change it.
 *
 * `applyMessage` is the single switch over the protocol union (SparkMonitor-style): every
 * message type is handled here and nowhere else, so the TypeScript compiler checks that the
 * switch is exhaustive when protocol.ts grows. It is pure data in, data out (no DOM, no
 * kernel), which keeps the comm model small and makes the merge rules unit-testable:
 *
 * - `snapshot` replaces everything it carries (it is the kernel's full state);
 * - `fallback` upserts rows keyed by (op, reason) — the kernel sends all rows today, but the
 *   protocol text allows "new rows only", and an upsert is right for both;
 * - `memory` appends to a bounded timeline; `cell` appends to a bounded list of records.
 */
import {
  ICellRecord,
  ICompiled,
  IDistributed,
  IFallbackRow,
  IFinding,
  IHelloMsg,
  IRegions,
  IRunning,
  KernelMessage,
  Counters,
  VERSION
} from './protocol';

/**
 * `no-kernel`: the notebook has none; `connecting`: comm opened, waiting for `hello`;
 * `not-loaded`: the kernel has no `neuron_lab` comm target; `loading`: `%load_ext` running;
 * `live`: receiving data; `restarting` / `dead`: the kernel process is going or gone.
 */
export type Status = 'no-kernel' | 'connecting' | 'not-loaded' | 'loading' | 'live' | 'restarting' | 'dead';

export interface IMemoryNow {
  allocated: number;
  reserved: number;
  peak: number;
  capacity: number;
}

export interface IState {
  status: Status;
  hello: IHelloMsg | null;
  memory: IMemoryNow | null;
  /** allocated bytes, oldest first, at most `limits.timeline` samples */
  timeline: number[];
  /** newest first */
  fallbacks: IFallbackRow[];
  /** newest first, at most `limits.cells` */
  cells: ICellRecord[];
  running: IRunning | null;
  /** execution count N -> cell id: where a `Cell In[N], line M` location points */
  cellIds: Record<string, string>;
  /** the advisor's findings from the last snapshot, ranked */
  advice: IFinding[];
  /** the kernel's torch.distributed rank and world size, from the last snapshot */
  distributed: IDistributed | null;
  /** torch.compile on neuron, from the last snapshot */
  compiled: ICompiled | null;
  regions: IRegions | null;
  counters: Counters | null;
  /** the last `error` message from the kernel, or a failed `%load_ext` */
  lastError: string | null;
  /** set when the kernel speaks another protocol version (data is still shown, best effort) */
  versionWarning: string | null;
  /** Date.now() of the last message */
  updated: number;
}

export interface ILimits {
  timeline: number;
  cells: number;
}

export const DEFAULT_LIMITS: ILimits = { timeline: 120, cells: 10 };

export function emptyState(status: Status = 'no-kernel'): IState {
  return {
    status,
    hello: null,
    memory: null,
    timeline: [],
    fallbacks: [],
    cells: [],
    running: null,
    cellIds: {},
    advice: [],
    distributed: null,
    compiled: null,
    regions: null,
    counters: null,
    lastError: null,
    versionWarning: null,
    updated: 0
  };
}

function withCellIds(
  ids: Record<string, string>,
  recs: { cell_id: string | null; execution_count?: number | null }[]
): Record<string, string> {
  let out = ids;
  for (const r of recs) {
    const n = r.execution_count;
    if (n !== null && n !== undefined && r.cell_id && out[String(n)] !== r.cell_id) {
      out = { ...out, [String(n)]: r.cell_id };
    }
  }
  return out;
}

/** Apply one kernel message; returns a new state (the old one is not modified). */
export function applyMessage(prev: IState, msg: KernelMessage, limits: ILimits = DEFAULT_LIMITS): IState {
  const s: IState = { ...prev, updated: Date.now() };
  if (msg.v !== VERSION) {
    s.versionWarning = `kernel speaks neuron_lab protocol v${msg.v}, this panel v${VERSION}`;
  }
  switch (msg.type) {
    case 'hello':
      s.hello = msg;
      s.status = 'live';
      if (s.memory) {
        s.memory = { ...s.memory, capacity: msg.capacity };
      }
      return s;
    case 'snapshot': {
      const m = msg.memory;
      s.status = 'live';
      s.memory = { allocated: m.allocated, reserved: m.reserved, peak: m.peak, capacity: m.capacity };
      s.timeline = tail((m.timeline ?? []).map(p => p[1]), limits.timeline);
      if (s.timeline.length === 0) {
        s.timeline = [m.allocated];
      }
      s.fallbacks = sortFallbacks([...(msg.fallbacks ?? [])]);
      s.cells = tail(msg.cells ?? [], limits.cells).reverse();
      s.running = msg.running ?? null;
      s.cellIds = withCellIds({ ...prev.cellIds, ...(msg.cell_ids ?? {}) }, msg.cells ?? []);
      s.regions = msg.regions ?? null;
      s.advice = msg.advice ?? [];
      s.distributed = msg.distributed ?? null;
      s.compiled = msg.compiled ?? null;
      s.counters = msg.counters ?? null;
      return s;
    }
    case 'memory':
      s.memory = { allocated: msg.allocated, reserved: msg.reserved, peak: msg.peak, capacity: msg.capacity };
      s.timeline = tail([...prev.timeline, msg.allocated], limits.timeline);
      return s;
    case 'fallback':
      s.fallbacks = mergeFallbacks(prev.fallbacks, msg.rows ?? []);
      return s;
    case 'cell': {
      const r = msg.record;
      const rest = prev.cells.filter(c => !(c.cell_id === r.cell_id && c.started === r.started));
      s.cells = [r, ...rest].slice(0, limits.cells);
      s.cellIds = withCellIds(prev.cellIds, [r]);
      s.running = prev.running ? { ...prev.running, cell_id: null } : null;
      return s;
    }
    case 'running': {
      const { type: _t, v: _v, ...running } = msg;
      s.running = running;
      s.cellIds = withCellIds(prev.cellIds, [running]);
      if (s.regions) {
        s.regions = { ...s.regions, compiles_pending: msg.compile_queue };
      }
      return s;
    }
    case 'error':
      s.lastError = msg.message;
      return s;
    default:
      return assertNever(msg);
  }
}

export function fallbackKey(row: IFallbackRow): string {
  return `${row.op}\u0000${row.reason}`;
}

export function mergeFallbacks(prev: IFallbackRow[], rows: IFallbackRow[]): IFallbackRow[] {
  const byKey = new Map<string, IFallbackRow>();
  for (const r of prev) {
    byKey.set(fallbackKey(r), r);
  }
  for (const r of rows) {
    byKey.set(fallbackKey(r), r);
  }
  return sortFallbacks([...byKey.values()]);
}

/** Newest first: by the kernel's `last_seen`, then its sequence number; stable otherwise. */
export function sortFallbacks(rows: IFallbackRow[]): IFallbackRow[] {
  return rows
    .map((r, i) => ({ r, i }))
    .sort((a, b) => {
      const t = (b.r.last_seen ?? 0) - (a.r.last_seen ?? 0);
      if (t !== 0) {
        return t;
      }
      const q = (b.r.seq ?? 0) - (a.r.seq ?? 0);
      return q !== 0 ? q : a.i - b.i;
    })
    .map(x => x.r);
}

function tail<T>(xs: T[], n: number): T[] {
  return xs.length > n ? xs.slice(xs.length - n) : xs.slice();
}

function assertNever(x: never): never {
  throw new Error(`unhandled neuron_lab message ${JSON.stringify(x)}`);
}
