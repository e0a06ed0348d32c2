/**
 * The comm protocol between the side panel and the kernel, mirrored from
 * `neuron_lab/jupyter/protocol.py` (the Python side is the source of truth).
 *
 * Every message is `{type, v, ...body}`: `type` discriminates one union per direction, `v` is
 * the protocol version. Change this file together with protocol.py; the test
 * `tests/e2e/test_protocol_mirror.py` checks that the type names, the version and the rate
 * limits agree. The panel may send only `FrontendMessage`s: it can never make the kernel run
 * code (the one exception, `%load_ext neuron_lab`, goes through a normal execute request on
 * the user's click, not through the comm).
 */

export const TARGET = 'neuron_lab';
export const VERSION = 1;

export const DEFAULT_PUSH_HZ = 4.0;
export const MIN_PUSH_HZ = 0.5;
export const MAX_PUSH_HZ = 20.0;

/** A notebook location, `Cell In[N], line M` (IPython's form), parsed; null for `file.py:line`. */
export interface ICellLocation {
  n: number;
  line: number;
}

export function parseCellLocation(loc: string): ICellLocation | null {
  const m = /^Cell In\[(\d+)\](?:, line (\d+))?$/.exec(loc);
  return m ? { n: Number(m[1]), line: m[2] ? Number(m[2]) : 1 } : null;
}

// ---- shared records ---------------------------------------------------------------------

/**
 * One fallback row per (op, reason); `locations` are the user's lines, most frequent first:
 * `Cell In[N], line M` for notebook code (as IPython's tracebacks say), else `file.py:line`.
 */
export interface IFallbackRow {
  op: string;
  reason: string;
  count: number;
  locations: string[];
  /** location -> the source text of that line (when the kernel could read it). */
  source?: Record<string, string>;
  first_seen?: number;
  last_seen?: number;
  seq?: number;
}

/** One advisor finding; `where` is a location (`Cell In[N], line M`, `Cell In[N]` or `file.py:line`). */
export interface IFinding {
  kind: string;
  where: string;
  message: string;
  fix: string;
  /** modelled trn2 seconds it costs (a model) */
  modelled_s: number;
  count: number;
}

/** A finished cell's record. */
export interface ICellRecord {
  cell_id: string | null;
  /** IPython's execution count N (`In[N]`) of that run */
  execution_count?: number | null;
  index?: number;
  started: number;
  wall_s: number;
  device_s: number;
  ops: number;
  launches: number;
  fused_share: number;
  compiles: number;
  fallbacks: number;
  peak_bytes: number;
  /** modelled Trainium2 seconds of the cell's recorded launches (null: none priced) */
  modelled_s?: number | null;
  modelled_ops?: number;
}

/** Live timing of the running cell; `cell_id` is null when the kernel is idle. */
export interface IRunning {
  cell_id: string | null;
  execution_count?: number | null;
  elapsed_s: number;
  ops: number;
  ops_per_s: number;
  launches: number;
  fused_share: number;
  compile_queue: number;
}

export interface IMemorySample {
  t: number;
  allocated: number;
  reserved: number;
  peak: number;
  capacity: number;
}

/** Memory in a snapshot: the current figures and `[t_rel_s, allocated]` samples. */
export interface ISnapshotMemory {
  allocated: number;
  reserved: number;
  peak: number;
  capacity: number;
  timeline: [number, number][];
}

export interface IRegions {
  count: number;
  hit_rate: number;
  hits: number;
  misses: number;
  compiles_pending: number;
  compiles_failed: number;
  fused_share: number;
}

export type Counters = Record<string, unknown>;

// ---- kernel -> frontend -----------------------------------------------------------------

interface IEnvelope<T extends string> {
  type: T;
  v: number;
}

export interface IHelloMsg extends IEnvelope<'hello'> {
  neuron_lab: string;
  executor: string;
  mode: string;
  capacity: number;
  push_hz: number;
  /** the modelled chip, e.g. "Trainium3" (NEURON_LAB_CHIP); absent from older kernels */
  chip?: string;
}

export interface ISnapshotMsg extends IEnvelope<'snapshot'> {
  memory: ISnapshotMemory;
  fallbacks: IFallbackRow[];
  cells: ICellRecord[];
  running: IRunning;
  regions: IRegions;
  counters: Counters;
  /** execution count N (as a string key) -> the cell id, for `Cell In[N]` locations */
  cell_ids?: Record<string, string>;
  /** the advisor's top findings (neuron_lab.advise()), ranked */
  advice?: IFinding[];
  /** the kernel's place in its torch.distributed job (world_size 1 without one) */
  distributed?: IDistributed;
  /** torch.compile on neuron: totals and the latest recompiles, graph breaks, failures */
  compiled?: ICompiled;
}

export interface ICompiledRow {
  kind: 'recompile' | 'graph break' | 'failure';
  /** the user's line: `Cell In[N], line M` in a notebook */
  location: string;
  /** the failed guard, the break's reason, or the error and what ran instead */
  detail: string;
  count: number;
}

export interface ICompiled {
  frames: number;
  programs: number;
  recompiles: number;
  graph_breaks: number;
  failures: number;
  compile_s: number;
  rows: ICompiledRow[];
}

export interface IDistributed {
  rank: number;
  world_size: number;
  /** e.g. "neuron:neuron"; null without a process group */
  backend: string | null;
  collectives: number;
  collective_bytes: number;
  collective_s: number;
}

export interface IMemoryMsg extends IEnvelope<'memory'>, IMemorySample {}

export interface IFallbackMsg extends IEnvelope<'fallback'> {
  rows: IFallbackRow[];
}

export interface ICellMsg extends IEnvelope<'cell'> {
  record: ICellRecord;
}

export interface IRunningMsg extends IEnvelope<'running'>, IRunning {}

export interface IErrorMsg extends IEnvelope<'error'> {
  message: string;
}

export type KernelMessage =
  | IHelloMsg
  | ISnapshotMsg
  | IMemoryMsg
  | IFallbackMsg
  | ICellMsg
  | IRunningMsg
  | IErrorMsg;

export type KernelMessageType = KernelMessage['type'];

export const KERNEL_TYPES: readonly KernelMessageType[] = [
  'hello',
  'snapshot',
  'memory',
  'fallback',
  'cell',
  'running',
  'error'
];

// ---- frontend -> kernel -----------------------------------------------------------------

export interface IRequestMsg extends IEnvelope<'request'> {
  what: 'snapshot';
}

export interface ISetRateMsg extends IEnvelope<'set_rate'> {
  hz: number;
}

export type FrontendMessage = IRequestMsg | ISetRateMsg;

export type FrontendMessageType = FrontendMessage['type'];

export const FRONTEND_TYPES: readonly FrontendMessageType[] = ['request', 'set_rate'];

// ---- helpers ------------------------------------------------------------------------------

/** Narrow untrusted comm data to a `KernelMessage` (type known, version checked by the caller). */
export function isKernelMessage(data: unknown): data is KernelMessage {
  if (typeof data !== 'object' || data === null) {
    return false;
  }
  const t = (data as { type?: unknown }).type;
  return typeof t === 'string' && (KERNEL_TYPES as readonly string[]).includes(t);
}

export function requestSnapshot(): IRequestMsg {
  return { type: 'request', v: VERSION, what: 'snapshot' };
}

export function setRate(hz: number): ISetRateMsg {
  return { type: 'set_rate', v: VERSION, hz: clampRate(hz) };
}

export function clampRate(hz: number): number {
  if (!Number.isFinite(hz)) {
    return DEFAULT_PUSH_HZ;
  }
  return Math.min(MAX_PUSH_HZ, Math.max(MIN_PUSH_HZ, hz));
}
