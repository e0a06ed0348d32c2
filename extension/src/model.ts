/**
 * The comm model: one `neuron_lab` comm to one kernel, kept alive across what kernels do.
 *
 * Why a state machine rather than "open a comm once": users restart kernels, switch a
 * notebook's kernel, and run `%load_ext neuron_lab` after the panel is already open. So:
 *
 * - `setKernel()` follows the notebook's current kernel (the tracker calls it); the old comm
 *   is closed, the state reset.
 * - The kernel opens the comm itself at `%load_ext` (`comm_open` on iopub, `hello` as its data):
 *   `setKernel()` registers the `neuron_lab` comm target on the kernel connection, and a comm
 *   the kernel opens replaces whatever comm the model had. This is what keeps the panel live
 *   through a Run All: a frontend `comm_open` waits on the shell channel behind the running
 *   cells, while the kernel's own `comm_open` and pushes go out on iopub at once.
 * - The frontend also opens a comm once the kernel is idle or busy (panel opened after the
 *   load, page reload, restart with auto-load). ipykernel answers a comm_open for an
 *   unknown target with comm_close: that is the `not-loaded` signal. A kernel that says
 *   nothing within `helloTimeoutMs` while idle is treated the same way.
 * - In `not-loaded`, the first `idle` after code that mentions `neuron_lab` ran (seen as an
 *   `execute_input` on iopub, from any client) probes again, quietly, so a user's own
 *   `%load_ext neuron_lab` cell brings the panel up without a click. Not on every busy -> idle
 *   (the probe's own comm_open makes the kernel busy: that would loop), and not after every
 *   cell (each probe of an unloaded kernel logs "No such comm target" in the kernel's log).
 *   Loaded some other way (`%run setup.py`)? The button's `%load_ext` is then a no-op that
 *   connects.
 * - `restarting` / `autorestarting` drop the comm (the process is gone) and the next `idle`
 *   reconnects; `dead` stays dead until the kernel changes.
 * - The refresh rate is pushed as `set_rate` after the first `hello` of each comm when it
 *   differs, and whenever the setting changes; the kernel's answer is another `hello`, which
 *   is never answered again (no ping-pong when the kernel clamps).
 *
 * `loadExtension()` is the only code the panel ever executes, on the user's click.
 * Consumers listen to `stateChanged`; they never see the comm.
 */
import type { Kernel, KernelMessage as KM } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { clampRate, FrontendMessage, isKernelMessage, KernelMessage, requestSnapshot, setRate, TARGET } from './protocol';
import { applyMessage, DEFAULT_LIMITS, emptyState, ILimits, IState, Status } from './state';

export const LOAD_CODE = '%load_ext neuron_lab';

/** The part of a kernel connection the model uses (a fake implements just this in tests). */
export type IKernelLike = Pick<
  Kernel.IKernelConnection,
  | 'id'
  | 'name'
  | 'status'
  | 'statusChanged'
  | 'iopubMessage'
  | 'createComm'
  | 'registerCommTarget'
  | 'removeCommTarget'
  | 'requestExecute'
  | 'isDisposed'
>;

export interface IModelOptions {
  rateHz?: number;
  limits?: Partial<ILimits>;
  helloTimeoutMs?: number;
}

/** What changed: a message type, or `status` for connection changes. */
export type Change = KernelMessage['type'] | 'status';

export class NeuronModel implements IDisposable {
  constructor(options: IModelOptions = {}) {
    this._rate = options.rateHz === undefined ? null : clampRate(options.rateHz);
    this._limits = { ...DEFAULT_LIMITS, ...options.limits };
    this._helloTimeoutMs = options.helloTimeoutMs ?? 4000;
  }

  get stateChanged(): ISignal<this, Change> {
    return this._stateChanged;
  }

  /** Every valid message from the kernel, after it has been applied to `state`. */
  get messageReceived(): ISignal<this, KernelMessage> {
    return this._messageReceived;
  }

  get state(): IState {
    return this._state;
  }

  get kernel(): IKernelLike | null {
    return this._kernel;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  get rate(): number | null {
    return this._rate;
  }

  setLimits(limits: Partial<ILimits>): void {
    this._limits = { ...this._limits, ...limits };
  }

  /** Follow another kernel (or none). Same kernel: nothing happens. */
  setKernel(kernel: IKernelLike | null): void {
    if (kernel === this._kernel || this._disposed) {
      return;
    }
    this._closeComm(true);
    if (this._kernel) {
      this._kernel.statusChanged.disconnect(this._onStatus, this);
      this._kernel.iopubMessage.disconnect(this._onIopub, this);
      if (!this._kernel.isDisposed) {
        this._kernel.removeCommTarget(TARGET, this._onKernelComm);
      }
    }
    this._kernel = kernel;
    this._ranCode = false;
    if (!kernel) {
      this._reset('no-kernel');
      return;
    }
    kernel.statusChanged.connect(this._onStatus, this);
    kernel.iopubMessage.connect(this._onIopub, this);
    kernel.registerCommTarget(TARGET, this._onKernelComm);
    if (kernel.status === 'dead') {
      this._reset('dead');
    } else if (kernel.status === 'idle' || kernel.status === 'busy') {
      this._reset('connecting');
      this._openComm();
    } else {
      this._reset(kernel.status === 'restarting' || kernel.status === 'autorestarting' ? 'restarting' : 'connecting');
    }
  }

  /** Set the push rate (Hz, clamped); sent now if connected, else after the next `hello`. */
  setRate(hz: number): void {
    this._rate = clampRate(hz);
    if (this._comm && this._state.status === 'live') {
      this._send(setRate(this._rate));
    }
  }

  /** Ask the kernel for a full snapshot. */
  refresh(): void {
    if (this._comm) {
      this._send(requestSnapshot());
    }
  }

  /** Run `%load_ext neuron_lab` in the kernel (the only code the panel runs), then connect. */
  async loadExtension(): Promise<void> {
    const kernel = this._kernel;
    if (!kernel || kernel.isDisposed || this._disposed) {
      return;
    }
    this._closeComm(true);
    this._setStatus('loading', { lastError: null });
    try {
      const future = kernel.requestExecute({ code: LOAD_CODE, silent: false, store_history: false, stop_on_error: true });
      const reply = await future.done;
      if (kernel !== this._kernel) {
        return;
      }
      const content = reply.content as KM.IExecuteReplyMsg['content'];
      if (content.status !== 'ok') {
        const err = content as KM.IReplyErrorContent;
        this._setStatus('not-loaded', { lastError: `${LOAD_CODE} failed: ${err.ename}: ${err.evalue}` });
        return;
      }
      if (!this._comm) {
        this._openComm(); // the kernel opens its own comm at the load; this is for older kernels
      }
    } catch (e) {
      if (kernel === this._kernel) {
        this._setStatus('not-loaded', { lastError: `${LOAD_CODE} failed: ${String(e)}` });
      }
    }
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this.setKernel(null);
    this._disposed = true;
    Signal.clearData(this);
  }

  // ---- kernel status -----------------------------------------------------------------------

  private _onStatus(kernel: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (kernel !== this._kernel) {
      return;
    }
    switch (status) {
      case 'restarting':
      case 'autorestarting':
        this._closeComm(false);
        this._reset('restarting');
        break;
      case 'dead':
        this._closeComm(false);
        this._reset('dead');
        break;
      case 'idle': {
        const ranCode = this._ranCode;
        this._ranCode = false;
        const st = this._state.status;
        if (!this._comm && (st === 'restarting' || st === 'connecting')) {
          this._openComm();
        } else if (!this._comm && st === 'not-loaded' && ranCode) {
          this._openComm(true); // quiet probe: the user may have run %load_ext themselves
        }
        break;
      }
      default:
        break;
    }
  }

  private _onIopub(kernel: Kernel.IKernelConnection, msg: KM.IIOPubMessage): void {
    if (kernel === this._kernel && msg.header.msg_type === 'execute_input') {
      const code = (msg.content as KM.IExecuteInputMsg['content']).code ?? '';
      this._ranCode = this._ranCode || code.includes(TARGET);
    }
  }

  // ---- the comm ----------------------------------------------------------------------------

  private _openComm(quiet = false): void {
    const kernel = this._kernel;
    if (!kernel || kernel.isDisposed) {
      return;
    }
    let comm: Kernel.IComm;
    try {
      comm = kernel.createComm(TARGET);
    } catch (e) {
      this._setStatus('not-loaded', { lastError: `could not open the ${TARGET} comm: ${String(e)}` });
      return;
    }
    this._comm = comm;
    this._rateSynced = false;
    comm.onMsg = msg => this._onCommMsg(comm, msg);
    comm.onClose = () => this._onCommClose(comm);
    if (!quiet) {
      this._setStatus('connecting');
    }
    this._armHelloTimer(comm);
    try {
      comm.open({});
    } catch (e) {
      this._onCommClose(comm);
    }
  }

  /**
   * A comm the kernel opened (`%load_ext` in a cell, or a restart with auto-load): adopt it.
   * Bound once (an arrow) so `removeCommTarget` finds the same function.
   */
  private _onKernelComm = (comm: Kernel.IComm, msg: KM.ICommOpenMsg): void => {
    const kernel = this._kernel;
    if (this._disposed || !kernel || kernel.isDisposed) {
      void comm.close();
      return;
    }
    this._closeComm(true); // a pending probe or an older comm: the kernel's own one wins
    this._comm = comm;
    this._rateSynced = false;
    comm.onMsg = m => this._onCommMsg(comm, m);
    comm.onClose = () => this._onCommClose(comm);
    this._setStatus('connecting', { lastError: null });
    this._onCommMsg(comm, msg as unknown as KM.ICommMsgMsg); // its data is the hello
  };

  private _armHelloTimer(comm: Kernel.IComm): void {
    this._clearHelloTimer();
    this._helloTimer = setTimeout(() => {
      this._helloTimer = null;
      if (comm !== this._comm || this._state.status === 'live') {
        return;
      }
      if (this._kernel?.status === 'busy') {
        this._armHelloTimer(comm); // comm_open waits behind the running cell
      } else if (this._state.status === 'connecting') {
        this._setStatus('not-loaded'); // keep the comm: a late hello still brings us live
      }
    }, this._helloTimeoutMs);
  }

  private _clearHelloTimer(): void {
    if (this._helloTimer !== null) {
      clearTimeout(this._helloTimer);
      this._helloTimer = null;
    }
  }

  private _onCommMsg(comm: Kernel.IComm, msg: KM.ICommMsgMsg): void {
    if (comm !== this._comm) {
      return;
    }
    const data = msg.content.data as unknown;
    if (!isKernelMessage(data)) {
      return;
    }
    this._clearHelloTimer();
    this._state = applyMessage(this._state, data, this._limits);
    if (data.type === 'hello' && !this._rateSynced) {
      this._rateSynced = true;
      if (this._rate !== null && Math.abs(this._rate - data.push_hz) > 1e-9) {
        this._send(setRate(this._rate));
      }
    }
    this._messageReceived.emit(data);
    this._stateChanged.emit(data.type);
  }

  private _onCommClose(comm: Kernel.IComm): void {
    if (comm !== this._comm) {
      return;
    }
    this._comm = null;
    this._clearHelloTimer();
    const st = this._state.status;
    if (st !== 'restarting' && st !== 'dead' && st !== 'no-kernel' && st !== 'loading') {
      // unknown target (never loaded) or unload_ipython_extension: the data is stale
      this._reset('not-loaded', this._state.lastError);
    }
  }

  /** Close the current comm; `tell` sends comm_close (false when the kernel process is gone). */
  private _closeComm(tell: boolean): void {
    const comm = this._comm;
    this._comm = null;
    this._clearHelloTimer();
    if (!comm) {
      return;
    }
    try {
      if (tell && this._kernel && !this._kernel.isDisposed && !comm.isDisposed) {
        void comm.close();
      }
      comm.dispose();
    } catch {
      // a comm on a dead connection may refuse either; it is dropped all the same
    }
  }

  private _send(msg: FrontendMessage): void {
    try {
      this._comm?.send(msg as unknown as KM.ICommMsgMsg['content']['data']);
    } catch (e) {
      this._setStatus(this._state.status, { lastError: `send failed: ${String(e)}` });
    }
  }

  private _reset(status: Status, lastError: string | null = null): void {
    this._state = { ...emptyState(status), lastError };
    this._stateChanged.emit('status');
  }

  private _setStatus(status: Status, extra: Partial<IState> = {}): void {
    this._state = { ...this._state, ...extra, status };
    this._stateChanged.emit('status');
  }

  private _kernel: IKernelLike | null = null;
  private _comm: Kernel.IComm | null = null;
  private _state: IState = emptyState();
  private _rate: number | null;
  private _rateSynced = false;
  private _ranCode = false;
  private _limits: ILimits;
  private _helloTimeoutMs: number;
  private _helloTimer: ReturnType<typeof setTimeout> | null = null;
  private _disposed = false;
  private _stateChanged = new Signal<this, Change>(this);
  private _messageReceived = new Signal<this, KernelMessage>(this);
}
