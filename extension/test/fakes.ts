/**
 * Fakes for the unit tests: a kernel connection and its comms, shaped like the parts of
 * `@jupyterlab/services` the model uses, plus builders for protocol messages. The kernel
 * side behaves like ipykernel + neuron_lab: a comm_open to an unregistered target is answered
 * with comm_close; a registered one with hello + snapshot.
 */
import { Signal } from '@lumino/signaling';

import type { IKernelLike } from '../src/model';
import * as P from '../src/protocol';

export class FakeComm {
  constructor(
    readonly targetName: string,
    readonly kernel: FakeKernel,
    readonly commId: string
  ) {}
  onMsg: ((msg: any) => void) | null = null;
  onClose: ((msg: any) => void) | null = null;
  opened = false;
  closedByUs = false;
  isDisposed = false;
  sent: any[] = [];

  open(_data: unknown): void {
    this.opened = true;
    this.kernel.onOpen(this);
  }
  send(data: any): void {
    this.sent.push(data);
  }
  close(): void {
    this.closedByUs = true;
    this.onClose?.({ content: { comm_id: this.commId, data: {} } });
    this.dispose();
  }
  dispose(): void {
    this.isDisposed = true;
  }
  /** the kernel sends a comm_msg */
  receive(data: unknown): void {
    this.onMsg?.({ content: { comm_id: this.commId, data } });
  }
  /** the kernel sends comm_close (services calls onClose, then disposes the comm) */
  closeFromKernel(): void {
    this.onClose?.({ content: { comm_id: this.commId, data: {} } });
    this.dispose();
  }
}

export type Respond = 'auto' | 'manual';

export class FakeKernel {
  constructor(
    readonly id = 'k1',
    public loaded = false,
    public respond: Respond = 'auto'
  ) {}
  name = 'python3';
  status: string = 'idle';
  isDisposed = false;
  statusChanged = new Signal<FakeKernel, string>(this);
  iopubMessage = new Signal<FakeKernel, any>(this);
  comms: FakeComm[] = [];
  executed: string[] = [];
  executeReply: any = { status: 'ok' };
  pushHz = P.DEFAULT_PUSH_HZ;
  /** the kernel side opens its own comm at %load_ext (what neuron_lab does); false: older kernels */
  opensOnLoad = false;

  targets = new Map<string, (comm: any, msg: any) => void>();

  registerCommTarget(target: string, cb: (comm: any, msg: any) => void): void {
    this.targets.set(target, cb);
  }
  removeCommTarget(target: string, cb: (comm: any, msg: any) => void): void {
    if (this.targets.get(target) === cb) {
      this.targets.delete(target);
    }
  }
  /**
   * The kernel opens a comm (neuron_lab's `%load_ext`): comm_open with hello as its data, then
   * a snapshot, as services delivers them: a registered target gets the comm; none: it is closed.
   */
  openFromKernel(): FakeComm {
    this.loaded = true;
    const c = new FakeComm(P.TARGET, this, `k${this.comms.length + 1}`);
    this.comms.push(c);
    c.opened = true;
    const target = this.targets.get(P.TARGET);
    if (!target) {
      c.close();
      return c;
    }
    target(c, { content: { comm_id: c.commId, target_name: P.TARGET, data: hello({ push_hz: this.pushHz }) } });
    c.receive(snapshot());
    return c;
  }

  createComm(target: string): FakeComm {
    const c = new FakeComm(target, this, `c${this.comms.length + 1}`);
    this.comms.push(c);
    return c;
  }
  get lastComm(): FakeComm {
    return this.comms[this.comms.length - 1];
  }
  onOpen(c: FakeComm): void {
    if (this.respond !== 'auto') {
      return;
    }
    if (!this.loaded || c.targetName !== P.TARGET) {
      c.closeFromKernel();
      return;
    }
    c.receive(hello({ push_hz: this.pushHz }));
    c.receive(snapshot());
  }
  requestExecute(content: { code: string }): any {
    this.executed.push(content.code);
    this.iopubMessage.emit({ header: { msg_type: 'execute_input' }, content });
    if (content.code === '%load_ext neuron_lab' && this.executeReply.status === 'ok') {
      this.loaded = true;
      if (this.opensOnLoad) {
        this.openFromKernel();
      }
    }
    return { done: Promise.resolve({ content: this.executeReply }) };
  }
  /** another client (the notebook) runs a cell: busy, execute_input, idle */
  runCell(code = 'x = 1', body: () => void = () => {}): void {
    this.setStatus('busy');
    this.iopubMessage.emit({ header: { msg_type: 'execute_input' }, content: { code } });
    body();
    this.setStatus('idle');
  }
  setStatus(s: string): void {
    this.status = s;
    this.statusChanged.emit(s);
  }
  /** a restart: a new process without neuron_lab */
  restart(): void {
    this.setStatus('restarting');
    this.loaded = false;
    this.setStatus('starting');
    this.setStatus('idle');
  }
  asKernel(): IKernelLike {
    return this as unknown as IKernelLike;
  }
}

export function hello(over: Partial<P.IHelloMsg> = {}): P.IHelloMsg {
  return { type: 'hello', v: P.VERSION, neuron_lab: '0.1.0', executor: 'cpu', mode: 'adaptive', capacity: 1 << 30, push_hz: 4, ...over };
}

export function snapshot(over: Partial<P.ISnapshotMsg> = {}): P.ISnapshotMsg {
  return {
    type: 'snapshot',
    v: P.VERSION,
    memory: { allocated: 4096, reserved: 2 << 20, peak: 8192, capacity: 1 << 30, timeline: [[0.1, 1024], [0.2, 4096]] },
    fallbacks: [],
    cells: [],
    running: { cell_id: null, elapsed_s: 0, ops: 0, ops_per_s: 0, launches: 0, fused_share: 0, compile_queue: 0 },
    regions: { count: 2, hit_rate: 0.5, hits: 1, misses: 1, compiles_pending: 0, compiles_failed: 0, fused_share: 0.25 },
    counters: { ops: 3 },
    ...over
  };
}

export function fallbackRow(op: string, over: Partial<P.IFallbackRow> = {}): P.IFallbackRow {
  return {
    op,
    reason: 'float64 is not supported by Trainium',
    count: 1,
    locations: ['ipykernel_1/123.py:3'],
    source: { 'ipykernel_1/123.py:3': "y = torch.ones(3, device='neuron', dtype=torch.float64).sum()" },
    ...over
  };
}

export function cellRecord(i: number, over: Partial<P.ICellRecord> = {}): P.ICellRecord {
  return {
    cell_id: `cell-${i}`,
    index: i,
    started: 1000 + i,
    wall_s: 0.5,
    device_s: 0.1,
    ops: 10 * i,
    launches: 5,
    fused_share: 0.5,
    compiles: 0,
    fallbacks: 0,
    peak_bytes: 4096,
    ...over
  };
}

export function flush(): Promise<void> {
  return new Promise(resolve => setTimeout(resolve, 0));
}
