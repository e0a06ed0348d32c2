/** The tracker: one model per notebook, following the current notebook and its kernel. */
import { Signal } from '@lumino/signaling';
import { describe, expect, it } from 'vitest';

import { KernelTracker } from '../src/tracker';
import { FakeKernel } from './fakes';

class FakePanel {
  constructor(
    public path: string,
    kernel: FakeKernel | null
  ) {
    this.title = { label: path, changed: new Signal<any, void>(this) };
    this.sessionContext = { session: kernel ? { kernel } : null, kernelChanged: new Signal<any, any>(this) };
  }
  title: { label: string; changed: Signal<any, void> };
  sessionContext: { session: { kernel: FakeKernel } | null; kernelChanged: Signal<any, any> };
  context = { path: '' };
  isDisposed = false;
  disposed = new Signal<FakePanel, void>(this);
  changeKernel(k: FakeKernel | null): void {
    this.sessionContext.session = k ? { kernel: k } : null;
    this.sessionContext.kernelChanged.emit({});
  }
  dispose(): void {
    this.isDisposed = true;
    this.disposed.emit();
  }
}

class FakeNotebooks {
  currentWidget: FakePanel | null = null;
  currentChanged = new Signal<FakeNotebooks, FakePanel | null>(this);
  focus(p: FakePanel | null): void {
    this.currentWidget = p;
    this.currentChanged.emit(p);
  }
}

function setup() {
  const nbs = new FakeNotebooks();
  const tracker = new KernelTracker(nbs as any, { rateHz: 4 });
  return { nbs, tracker };
}

describe('KernelTracker', () => {
  it('has no model without a notebook, and one per notebook once focused', () => {
    const { nbs, tracker } = setup();
    expect(tracker.current.model).toBeNull();
    const a = new FakePanel('a.ipynb', new FakeKernel('ka', true));
    const b = new FakePanel('b.ipynb', new FakeKernel('kb', false));
    const seen: string[] = [];
    tracker.currentChanged.connect((_, c) => seen.push(c.label));
    nbs.focus(a);
    const ma = tracker.current.model!;
    expect(ma.state.status).toBe('live');
    nbs.focus(b);
    expect(tracker.current.model!.state.status).toBe('not-loaded');
    nbs.focus(a);
    expect(tracker.current.model).toBe(ma); // kept, with its data
    expect(tracker.size).toBe(2);
    expect(seen).toEqual(['a.ipynb', 'b.ipynb', 'a.ipynb']);
    tracker.dispose();
  });

  it("follows the notebook's kernel change", () => {
    const { nbs, tracker } = setup();
    const k1 = new FakeKernel('k1', false);
    const p = new FakePanel('a.ipynb', k1);
    nbs.focus(p);
    const m = tracker.current.model!;
    expect(m.kernel).toBe(k1);
    const k2 = new FakeKernel('k2', true);
    p.changeKernel(k2);
    expect(m.kernel).toBe(k2);
    expect(m.state.status).toBe('live');
    p.changeKernel(null);
    expect(m.state.status).toBe('no-kernel');
    tracker.dispose();
  });

  it('disposes a closed notebook’s model and moves to the next current notebook', () => {
    const { nbs, tracker } = setup();
    const k = new FakeKernel('k1', true);
    const a = new FakePanel('a.ipynb', k);
    const b = new FakePanel('b.ipynb', new FakeKernel('k2', true));
    nbs.focus(b);
    nbs.focus(a);
    const ma = tracker.current.model!;
    nbs.currentWidget = b; // the real tracker moves on when a notebook closes
    a.dispose();
    expect(ma.isDisposed).toBe(true);
    expect(k.lastComm.closedByUs).toBe(true);
    expect(tracker.current.label).toBe('b.ipynb');
    expect(tracker.size).toBe(1);
    tracker.dispose();
  });

  it('passes the refresh rate to every model', () => {
    const { nbs, tracker } = setup();
    const ka = new FakeKernel('ka', true);
    const kb = new FakeKernel('kb', true);
    nbs.focus(new FakePanel('a.ipynb', ka));
    nbs.focus(new FakePanel('b.ipynb', kb));
    tracker.setRate(8);
    expect(ka.lastComm.sent).toEqual([{ type: 'set_rate', v: 1, hz: 8 }]);
    expect(kb.lastComm.sent).toEqual([{ type: 'set_rate', v: 1, hz: 8 }]);
    tracker.dispose();
  });
});
