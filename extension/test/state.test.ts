/** The one message switch: how each kernel message changes the panel's state. */
import { describe, expect, it } from 'vitest';

import { VERSION } from '../src/protocol';
import { applyMessage, emptyState, IState, mergeFallbacks } from '../src/state';
import { cellRecord, fallbackRow, hello, snapshot } from './fakes';

describe('applyMessage', () => {
  it('hello makes the state live and keeps the kernel facts', () => {
    const s = applyMessage(emptyState('connecting'), hello({ executor: 'cuda', push_hz: 8 }));
    expect(s.status).toBe('live');
    expect(s.hello?.executor).toBe('cuda');
    expect(s.hello?.push_hz).toBe(8);
  });

  it('snapshot replaces memory, timeline, fallbacks, cells (newest first), regions', () => {
    const prev = { ...emptyState('live'), timeline: [1, 2, 3], fallbacks: [fallbackRow('aten::old')] };
    const s = applyMessage(
      prev,
      snapshot({ fallbacks: [fallbackRow('aten::sum')], cells: [cellRecord(1), cellRecord(2)] })
    );
    expect(s.memory).toEqual({ allocated: 4096, reserved: 2 << 20, peak: 8192, capacity: 1 << 30 });
    expect(s.timeline).toEqual([1024, 4096]);
    expect(s.fallbacks.map(r => r.op)).toEqual(['aten::sum']);
    expect(s.cells.map(c => c.index)).toEqual([2, 1]);
    expect(s.regions?.hit_rate).toBe(0.5);
    expect(prev.timeline).toEqual([1, 2, 3]); // not mutated
  });

  it('an empty snapshot timeline still shows the current allocation', () => {
    const s = applyMessage(emptyState(), snapshot({ memory: { allocated: 7, reserved: 0, peak: 7, capacity: 9, timeline: [] } }));
    expect(s.timeline).toEqual([7]);
  });

  it('memory appends to a bounded timeline', () => {
    let s = emptyState('live');
    for (let i = 0; i < 8; i++) {
      s = applyMessage(s, { type: 'memory', v: VERSION, t: i, allocated: i * 10, reserved: 0, peak: i * 10, capacity: 100 }, { timeline: 5, cells: 3 });
    }
    expect(s.timeline).toEqual([30, 40, 50, 60, 70]);
    expect(s.memory?.allocated).toBe(70);
  });

  it('fallback rows are upserted by (op, reason) and listed newest first', () => {
    let s = applyMessage(emptyState('live'), { type: 'fallback', v: VERSION, rows: [fallbackRow('aten::ones', { last_seen: 1, seq: 1 })] });
    s = applyMessage(s, {
      type: 'fallback',
      v: VERSION,
      rows: [fallbackRow('aten::sum', { last_seen: 2, seq: 2 }), fallbackRow('aten::ones', { count: 5, last_seen: 3, seq: 3 })]
    });
    expect(s.fallbacks.map(r => [r.op, r.count])).toEqual([
      ['aten::ones', 5],
      ['aten::sum', 1]
    ]);
  });

  it('same op with another reason is another row', () => {
    const rows = mergeFallbacks([fallbackRow('aten::sum')], [fallbackRow('aten::sum', { reason: 'complex64', seq: 9 })]);
    expect(rows).toHaveLength(2);
    expect(rows[0].reason).toBe('complex64');
  });

  it('cell records go first, are de-duplicated and bounded; the running cell ends', () => {
    let s: IState = { ...emptyState('live'), running: { cell_id: 'cell-3', elapsed_s: 1, ops: 1, ops_per_s: 1, launches: 1, fused_share: 0, compile_queue: 0 } };
    for (const i of [1, 2, 3, 3]) {
      s = applyMessage(s, { type: 'cell', v: VERSION, record: cellRecord(i) }, { timeline: 10, cells: 2 });
    }
    expect(s.cells.map(c => c.index)).toEqual([3, 2]);
    expect(s.running?.cell_id).toBeNull();
  });

  it('running replaces the live timing and updates the compile queue', () => {
    let s = applyMessage(emptyState(), snapshot());
    s = applyMessage(s, { type: 'running', v: VERSION, cell_id: 'c', elapsed_s: 2, ops: 400, ops_per_s: 200, launches: 40, fused_share: 0.9, compile_queue: 3 });
    expect(s.running).toEqual({ cell_id: 'c', elapsed_s: 2, ops: 400, ops_per_s: 200, launches: 40, fused_share: 0.9, compile_queue: 3 });
    expect(s.regions?.compiles_pending).toBe(3);
  });

  it('error keeps the message; another protocol version warns but still applies', () => {
    let s = applyMessage(emptyState('live'), { type: 'error', v: VERSION, message: 'unsupported request type' });
    expect(s.lastError).toBe('unsupported request type');
    s = applyMessage(s, { ...hello(), v: VERSION + 1 });
    expect(s.versionWarning).toContain(`v${VERSION + 1}`);
    expect(s.status).toBe('live');
  });
});
