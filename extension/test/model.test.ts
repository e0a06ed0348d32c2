/** The comm model against a fake kernel: connect, not-loaded, load, restart, kernel change, rate. */
import { afterEach, describe, expect, it, vi } from 'vitest';

import { LOAD_CODE, NeuronModel } from '../src/model';
import { MAX_PUSH_HZ, TARGET } from '../src/protocol';
import { fallbackRow, FakeKernel, flush, hello, snapshot } from './fakes';

const models: NeuronModel[] = [];
function model(opts = {}): NeuronModel {
  const m = new NeuronModel(opts);
  models.push(m);
  return m;
}
afterEach(() => {
  models.splice(0).forEach(m => m.dispose());
  vi.useRealTimers();
});

describe('connecting', () => {
  it('opens the neuron_lab comm on an idle kernel and goes live on hello + snapshot', () => {
    const k = new FakeKernel('k1', true);
    const m = model();
    const changes: string[] = [];
    m.stateChanged.connect((_, c) => changes.push(c));
    m.setKernel(k.asKernel());
    expect(k.comms).toHaveLength(1);
    expect(k.lastComm.targetName).toBe(TARGET);
    expect(k.lastComm.opened).toBe(true);
    expect(m.state.status).toBe('live');
    expect(m.state.memory?.allocated).toBe(4096);
    expect(changes).toEqual(['status', 'status', 'hello', 'snapshot']);
  });

  it('waits for a starting kernel to become idle', () => {
    const k = new FakeKernel('k1', true);
    k.status = 'starting';
    const m = model();
    m.setKernel(k.asKernel());
    expect(k.comms).toHaveLength(0);
    expect(m.state.status).toBe('connecting');
    k.setStatus('idle');
    expect(m.state.status).toBe('live');
  });

  it('emits every valid message and ignores junk and messages on stale comms', () => {
    const k = new FakeKernel('k1', true);
    const m = model();
    const got: string[] = [];
    m.messageReceived.connect((_, msg) => got.push(msg.type));
    m.setKernel(k.asKernel());
    const comm = k.lastComm;
    comm.receive({ type: 'nonsense', v: 1 });
    comm.receive('not an object');
    comm.receive({ type: 'fallback', v: 1, rows: [fallbackRow('aten::sum')] });
    expect(got).toEqual(['hello', 'snapshot', 'fallback']);
    expect(m.state.fallbacks[0].op).toBe('aten::sum');
    m.setKernel(new FakeKernel('k2', true).asKernel());
    comm.receive({ type: 'fallback', v: 1, rows: [fallbackRow('aten::stale')] });
    expect(m.state.fallbacks.map(r => r.op)).not.toContain('aten::stale');
  });
});

describe('kernel-opened comm', () => {
  it('registers the comm target and goes live on a comm the kernel opens while busy', () => {
    const k = new FakeKernel('k1', false);
    const m = model();
    m.setKernel(k.asKernel());
    expect(m.state.status).toBe('not-loaded');
    expect(k.targets.has(TARGET)).toBe(true);
    // Run All: the first cell runs %load_ext, the kernel stays busy with the next cell
    k.setStatus('busy');
    k.iopubMessage.emit({ header: { msg_type: 'execute_input' }, content: { code: '%load_ext neuron_lab' } });
    const comm = k.openFromKernel();
    expect(m.state.status).toBe('live');
    expect(m.state.memory?.allocated).toBe(4096);
    comm.receive({ type: 'memory', v: 1, t: 1, allocated: 1 << 20, reserved: 2 << 20, peak: 1 << 20, capacity: 1 << 30 });
    expect(m.state.memory?.allocated).toBe(1 << 20);
    // the idle after the cells: no probe, the kernel's comm stays the one
    const before = k.comms.length;
    k.setStatus('idle');
    expect(k.comms).toHaveLength(before);
    expect(comm.closedByUs).toBe(false);
  });

  it("the kernel's comm replaces a pending frontend comm (opened while the kernel was busy)", () => {
    const k = new FakeKernel('k1', false, 'manual');
    k.status = 'busy';
    const m = model();
    m.setKernel(k.asKernel());
    const pending = k.lastComm;
    expect(m.state.status).toBe('connecting');
    const mine = k.openFromKernel();
    expect(pending.closedByUs).toBe(true);
    expect(m.state.status).toBe('live');
    pending.receive(hello()); // the kernel answers the old comm_open late: ignored
    pending.closeFromKernel();
    expect(m.state.status).toBe('live');
    mine.closeFromKernel(); // %unload_ext
    expect(m.state.status).toBe('not-loaded');
  });

  it('sends set_rate after the kernel-opened hello when the setting differs', () => {
    const k = new FakeKernel('k1', false);
    const m = model({ rateHz: 10 });
    m.setKernel(k.asKernel());
    const comm = k.openFromKernel();
    expect(comm.sent).toEqual([expect.objectContaining({ type: 'set_rate', hz: 10 })]);
  });

  it('follows a restart and a kernel change: the target moves with the kernel', () => {
    const k1 = new FakeKernel('k1', false);
    const m = model();
    m.setKernel(k1.asKernel());
    k1.restart();
    k1.openFromKernel(); // auto-load in the new process
    expect(m.state.status).toBe('live');
    const k2 = new FakeKernel('k2', false);
    m.setKernel(k2.asKernel());
    expect(k1.targets.has(TARGET)).toBe(false);
    expect(k2.targets.has(TARGET)).toBe(true);
    const stale = k1.openFromKernel();
    expect(stale.closedByUs).toBe(true); // no target on the old kernel: services closes it
    k2.openFromKernel();
    expect(m.state.status).toBe('live');
  });

  it('a disposed model refuses a kernel comm', () => {
    const k = new FakeKernel('k1', false);
    const m = model();
    m.setKernel(k.asKernel());
    m.dispose();
    expect(k.targets.has(TARGET)).toBe(false);
  });
});

describe('not loaded', () => {
  it('a comm_close answer means neuron_lab is not loaded', () => {
    const k = new FakeKernel('k1', false);
    const m = model();
    m.setKernel(k.asKernel());
    expect(m.state.status).toBe('not-loaded');
    expect(k.executed).toEqual([]); // nothing runs without a click
  });

  it('loadExtension runs exactly %load_ext neuron_lab, then connects', async () => {
    const k = new FakeKernel('k1', false);
    const m = model();
    m.setKernel(k.asKernel());
    const done = m.loadExtension();
    expect(m.state.status).toBe('loading');
    await done;
    expect(k.executed).toEqual([LOAD_CODE]);
    expect(m.state.status).toBe('live');
    expect(k.comms).toHaveLength(2);
  });

  it("loadExtension adopts the kernel's comm and opens no second one", async () => {
    const k = new FakeKernel('k1', false);
    k.opensOnLoad = true;
    const m = model();
    m.setKernel(k.asKernel());
    const probe = k.lastComm;
    await m.loadExtension();
    expect(m.state.status).toBe('live');
    expect(k.comms).toHaveLength(2); // the not-loaded probe and the kernel's own
    expect(probe.isDisposed).toBe(true);
    expect(k.comms[1].closedByUs).toBe(false);
  });

  it('a failed %load_ext says why and stays not-loaded', async () => {
    const k = new FakeKernel('k1', false);
    k.executeReply = { status: 'error', ename: 'ModuleNotFoundError', evalue: "No module named 'neuron_lab'" };
    const m = model();
    m.setKernel(k.asKernel());
    await m.loadExtension();
    expect(m.state.status).toBe('not-loaded');
    expect(m.state.lastError).toContain('ModuleNotFoundError');
  });

  it("notices the user's own %load_ext once the cell finishes (probe after code ran)", () => {
    const k = new FakeKernel('k1', false);
    const m = model();
    m.setKernel(k.asKernel());
    expect(m.state.status).toBe('not-loaded');
    k.setStatus('busy'); // e.g. the kernel handling the probe's own comm_open
    k.setStatus('idle');
    expect(k.comms).toHaveLength(1); // no code ran: no probe (else every probe would probe again)
    k.runCell('x = 1'); // a cell that has nothing to do with neuron_lab: no probe, no kernel log noise
    expect(k.comms).toHaveLength(1);
    k.runCell('import neuron_lab'); // mentions it, does not load it: probed, still not loaded
    expect(k.comms).toHaveLength(2);
    expect(m.state.status).toBe('not-loaded');
    k.runCell('import torch\n%load_ext neuron_lab', () => (k.loaded = true));
    expect(k.comms).toHaveLength(3);
    expect(m.state.status).toBe('live');
  });

  it('a silent kernel is not-loaded after the hello timeout, unless it is busy', () => {
    vi.useFakeTimers();
    const k = new FakeKernel('k1', true, 'manual');
    k.status = 'busy';
    const m = model({ helloTimeoutMs: 1000 });
    m.setKernel(k.asKernel());
    vi.advanceTimersByTime(3000);
    expect(m.state.status).toBe('connecting'); // comm_open waits behind the running cell
    k.setStatus('idle');
    vi.advanceTimersByTime(1100);
    expect(m.state.status).toBe('not-loaded');
    k.lastComm.receive(hello()); // a late hello still brings it up
    expect(m.state.status).toBe('live');
  });

  it('unloading the extension (kernel closes the comm) goes back to not-loaded', () => {
    const k = new FakeKernel('k1', true);
    const m = model();
    m.setKernel(k.asKernel());
    k.lastComm.closeFromKernel();
    expect(m.state.status).toBe('not-loaded');
    expect(m.state.memory).toBeNull();
  });
});

describe('kernel lifecycle', () => {
  it('restart drops the comm and data, then reconnects on idle (to a fresh, unloaded kernel)', async () => {
    const k = new FakeKernel('k1', true);
    const m = model();
    m.setKernel(k.asKernel());
    const first = k.lastComm;
    const seen: string[] = [];
    m.stateChanged.connect(() => seen.push(m.state.status));
    k.setStatus('restarting');
    expect(m.state.status).toBe('restarting');
    expect(m.state.memory).toBeNull();
    expect(first.isDisposed).toBe(true);
    expect(first.closedByUs).toBe(false); // the process is gone; no comm_close sent
    k.loaded = false;
    k.setStatus('starting');
    k.setStatus('idle');
    expect(k.comms).toHaveLength(2);
    expect(m.state.status).toBe('not-loaded');
    await m.loadExtension();
    expect(m.state.status).toBe('live');
    expect(seen).toContain('restarting');
  });

  it('autorestarting and dead are handled; a dead kernel is not probed', () => {
    const k = new FakeKernel('k1', true);
    const m = model();
    m.setKernel(k.asKernel());
    k.setStatus('autorestarting');
    expect(m.state.status).toBe('restarting');
    k.setStatus('dead');
    expect(m.state.status).toBe('dead');
    k.runCell();
    expect(m.state.status).toBe('dead');
  });

  it('kernel change closes the old comm and follows the new kernel', () => {
    const k1 = new FakeKernel('k1', true);
    const k2 = new FakeKernel('k2', false);
    const m = model();
    m.setKernel(k1.asKernel());
    const old = k1.lastComm;
    m.setKernel(k2.asKernel());
    expect(old.closedByUs).toBe(true);
    expect(m.state.status).toBe('not-loaded');
    k1.setStatus('restarting'); // the old kernel no longer matters
    expect(m.state.status).toBe('not-loaded');
    m.setKernel(null);
    expect(m.state.status).toBe('no-kernel');
    expect(k2.comms.every(c => c.isDisposed)).toBe(true);
  });

  it('setting the same kernel again does nothing', () => {
    const k = new FakeKernel('k1', true);
    const m = model();
    m.setKernel(k.asKernel());
    m.setKernel(k.asKernel());
    expect(k.comms).toHaveLength(1);
  });

  it('dispose closes the comm and stops listening', () => {
    const k = new FakeKernel('k1', true);
    const m = new NeuronModel();
    m.setKernel(k.asKernel());
    const comm = k.lastComm;
    m.dispose();
    expect(comm.closedByUs).toBe(true);
    expect(m.isDisposed).toBe(true);
    k.setStatus('restarting');
    expect(m.state.status).toBe('no-kernel');
  });
});

describe('refresh rate', () => {
  it('sends set_rate once after the first hello when the setting differs', () => {
    const k = new FakeKernel('k1', true);
    const m = model({ rateHz: 10 });
    m.setKernel(k.asKernel());
    const comm = k.lastComm;
    expect(comm.sent).toEqual([{ type: 'set_rate', v: 1, hz: 10 }]);
    comm.receive(hello({ push_hz: 10 })); // the kernel's answer
    expect(comm.sent).toHaveLength(1);
    expect(m.state.hello?.push_hz).toBe(10);
  });

  it('does not send set_rate when the kernel already pushes at that rate', () => {
    const k = new FakeKernel('k1', true);
    const m = model({ rateHz: 4 });
    m.setKernel(k.asKernel());
    expect(k.lastComm.sent).toEqual([]);
  });

  it('a settings change is sent at once, clamped; a clamped answer is not argued with', () => {
    const k = new FakeKernel('k1', true);
    const m = model({ rateHz: 4 });
    m.setKernel(k.asKernel());
    m.setRate(50);
    expect(k.lastComm.sent).toEqual([{ type: 'set_rate', v: 1, hz: MAX_PUSH_HZ }]);
    k.lastComm.receive(hello({ push_hz: 12 })); // whatever the kernel settles on
    expect(k.lastComm.sent).toHaveLength(1);
  });

  it('the rate is re-sent after a restart (a new process starts at its default)', async () => {
    const k = new FakeKernel('k1', true);
    const m = model({ rateHz: 2 });
    m.setKernel(k.asKernel());
    k.restart();
    await m.loadExtension();
    expect(k.lastComm.sent).toEqual([{ type: 'set_rate', v: 1, hz: 2 }]);
  });

  it('refresh asks for a snapshot', async () => {
    const k = new FakeKernel('k1', true);
    const m = model();
    m.setKernel(k.asKernel());
    m.refresh();
    expect(k.lastComm.sent).toEqual([{ type: 'request', v: 1, what: 'snapshot' }]);
    k.lastComm.receive(snapshot({ fallbacks: [fallbackRow('aten::sum')] }));
    await flush();
    expect(m.state.fallbacks).toHaveLength(1);
  });
});
