// @vitest-environment happy-dom
/** Rendering: what the panel shows for a live kernel, and the not-loaded view's one button. */
import { describe, expect, it, vi } from 'vitest';

import { applyMessage, emptyState } from '../src/state';
import { renderPanel } from '../src/widget';
import { bytes, location, pct, seconds } from '../src/components/format';
import { cellRecord, fallbackRow, hello, snapshot } from './fakes';

const q = (el: HTMLElement, nl: string) => el.querySelector(`[data-nl="${nl}"]`) as HTMLElement | null;
const actions = () => ({ load: vi.fn(), refresh: vi.fn() });

describe('renderPanel', () => {
  it('shows memory, fallbacks with the source line, cells and regions', () => {
    let s = applyMessage(emptyState('connecting'), hello());
    s = applyMessage(
      s,
      snapshot({
        fallbacks: [fallbackRow('aten::sum', { count: 2 })],
        cells: [cellRecord(1, { fallbacks: 2, modelled_s: 0.00042, modelled_ops: 9 }), cellRecord(2, { execution_count: 7 })]
      })
    );
    const el = renderPanel(s, 'a.ipynb', actions());
    expect(el.dataset.status).toBe('live');
    expect(q(el, 'allocated')!.textContent).toBe('4.00 KiB');
    expect(q(el, 'allocated')!.dataset.bytes).toBe('4096');
    expect(q(el, 'capacity')!.textContent).toBe('1.00 GiB');
    const row = q(el, 'fallback-row')!;
    expect(row.dataset.op).toBe('aten::sum');
    expect(row.textContent).toContain('aten::sum');
    expect(q(el, 'reason')!.textContent).toContain('float64 is not supported');
    expect(q(el, 'location')!.textContent).toBe('ipykernel_1/123.py:3');
    expect(q(el, 'source')!.textContent).toContain('dtype=torch.float64');
    const rows = el.querySelectorAll('[data-nl="cell-row"]');
    expect(rows).toHaveLength(2);
    expect(rows[0].firstChild!.textContent).toBe('7'); // In[N] when the kernel knows it
    expect((rows[0].querySelector('[data-nl="modelled"]') as HTMLElement).textContent).toBe('—'); // nothing priced
    expect((rows[1].querySelector('[data-nl="modelled"]') as HTMLElement).textContent).toBe('420 µs');
    expect(q(el, 'hit-rate')!.textContent).toBe('50%');
    expect(q(el, 'hello')!.textContent).toContain('neuron:0 Trainium2 on cpu'); // no chip in the hello: trn2
    expect(el.querySelector('polyline')).not.toBeNull();
  });

  it("a notebook location is a link that reveals its cell (id from the kernel's map, else In[N])", () => {
    const loc = 'Cell In[3], line 4';
    const row = fallbackRow('aten::sum', { locations: [loc, 'Cell In[5], line 1'], source: { [loc]: 'y = x.double()' } });
    let s = applyMessage(emptyState('connecting'), snapshot({ fallbacks: [row], cell_ids: { '3': 'abc-id' } }));
    const reveal = vi.fn();
    const el = renderPanel(s, 'a.ipynb', { ...actions(), reveal });
    const link = q(el, 'location')!;
    expect(link.tagName).toBe('A');
    expect(link.textContent).toBe(loc);
    expect(link.dataset.cell).toBe('abc-id');
    expect(link.parentElement!.textContent).toBe('Cell In[3], line 4 (+1 more)');
    link.click();
    expect(reveal).toHaveBeenCalledWith({ n: 3, line: 4 }, 'abc-id');
    // a cell that finished later maps its own count; an unknown count reveals by In[N] alone
    s = applyMessage(s, { type: 'cell', v: 1, record: cellRecord(7, { cell_id: 'def', execution_count: 5 }) });
    expect(s.cellIds).toEqual({ '3': 'abc-id', '5': 'def' });
    s = applyMessage(s, { type: 'fallback', v: 1, rows: [fallbackRow('aten::mean', { locations: ['Cell In[9], line 2'] })] });
    const el2 = renderPanel(s, 'a.ipynb', { ...actions(), reveal });
    const links = [...el2.querySelectorAll('a[data-nl="location"]')] as HTMLElement[];
    links.find(a => a.dataset.n === '9')!.click();
    expect(reveal).toHaveBeenLastCalledWith({ n: 9, line: 2 }, null);
    // a script's file:line stays plain text
    expect(q(renderPanel(applyMessage(emptyState(), snapshot({ fallbacks: [fallbackRow('aten::sum')] })), 'a', { ...actions(), reveal }), 'location')!.tagName).toBe('CODE');
  });

  it('shows the rank and world size of the kernel\'s process group, and nothing without one', () => {
    const live = applyMessage(emptyState('connecting'), hello());
    const single = applyMessage(live, snapshot({ distributed: { rank: 0, world_size: 1, backend: null, collectives: 0, collective_bytes: 0, collective_s: 0 } }));
    expect(q(renderPanel(single, 'a.ipynb', actions()), 'rank')).toBeNull();
    const job = applyMessage(live, snapshot({ distributed: { rank: 1, world_size: 2, backend: 'neuron:neuron', collectives: 30, collective_bytes: 1024, collective_s: 0.2 } }));
    expect(q(renderPanel(job, 'a.ipynb', actions()), 'rank')!.textContent).toBe('rank 1 of 2 · neuron:neuron · 30 collectives');
    const old = applyMessage(live, snapshot());           // a kernel that sends no `distributed`
    expect(q(renderPanel(old, 'a.ipynb', actions()), 'rank')).toBeNull();
  });

  it('compiled graphs: totals, and recompiles / graph breaks / failures at the user\'s cell', () => {
    const live = applyMessage(emptyState('connecting'), hello());
    expect(q(renderPanel(applyMessage(live, snapshot()), 'a.ipynb', actions()), 'compiled')).toBeNull();
    const compiled = {
      frames: 3, programs: 4, recompiles: 1, graph_breaks: 2, failures: 0, compile_s: 1.5,
      rows: [
        { kind: 'recompile' as const, location: 'Cell In[5], line 2', detail: 'f: tensor x size mismatch at index 0', count: 1 },
        { kind: 'graph break' as const, location: 'Cell In[4], line 3', detail: 'Data-dependent branching', count: 2 }
      ]
    };
    const reveal = vi.fn();
    const el = renderPanel(applyMessage(live, snapshot({ compiled, cell_ids: { '4': 'id4' } })), 'a.ipynb', { ...actions(), reveal });
    const sec = q(el, 'compiled')!;
    expect(q(sec, 'programs')!.textContent).toBe('4');
    expect(q(sec, 'graph-breaks')!.textContent).toBe('2');
    const rows = sec.querySelectorAll('[data-nl="compiled-row"]');
    expect(rows).toHaveLength(2);
    expect((rows[1] as HTMLElement).dataset.kind).toBe('graph break');
    expect(rows[1].textContent).toContain('graph break ×2');
    expect(rows[1].textContent).toContain('Data-dependent branching');
    const link = rows[1].querySelector('[data-nl="location"]') as HTMLElement;
    expect(link.textContent).toBe('Cell In[4], line 3');
    link.click();
    expect(reveal).toHaveBeenCalledWith({ n: 4, line: 3 }, 'id4');
  });

  it('advice: ranked findings with a link to the cell, the fix and the modelled cost', () => {
    const advice = [
      { kind: 'host-sync-in-loop', where: 'Cell In[4], line 3', message: '.item() ran 10 times', fix: 'keep it on the device', modelled_s: 0.00015, count: 10 },
      { kind: 'memory-near-capacity', where: 'Cell In[2]', message: 'peak 90%', fix: 'del x', modelled_s: 0, count: 1 }
    ];
    const s = applyMessage(emptyState('connecting'), snapshot({ advice, cell_ids: { '4': 'id4' } }));
    const reveal = vi.fn();
    const el = renderPanel(s, 'a.ipynb', { ...actions(), reveal });
    const items = el.querySelectorAll('[data-nl="finding"]');
    expect(items).toHaveLength(2);
    expect((items[0] as HTMLElement).dataset.kind).toBe('host-sync-in-loop');
    expect(items[0].textContent).toContain('150 µs');
    expect(items[0].querySelector('[data-nl="fix"]')!.textContent).toBe('Fix: keep it on the device');
    (items[1].querySelector('a[data-nl="location"]') as HTMLElement).click();
    expect(reveal).toHaveBeenCalledWith({ n: 2, line: 1 }, null);
    (items[0].querySelector('a[data-nl="location"]') as HTMLElement).click();
    expect(reveal).toHaveBeenLastCalledWith({ n: 4, line: 3 }, 'id4');
  });

  it('shows the running cell live', () => {
    let s = applyMessage(emptyState(), snapshot());
    s = applyMessage(s, { type: 'running', v: 1, cell_id: 'c1', elapsed_s: 1.5, ops: 300, ops_per_s: 200, launches: 30, fused_share: 0.75, compile_queue: 1 });
    const el = renderPanel(s, 'a.ipynb', actions());
    expect(q(el, 'status')!.textContent).toBe('running');
    expect(q(el, 'elapsed')!.textContent).toBe('1.50 s');
    expect(q(el, 'fused-share')!.textContent).toBe('75%');
    expect(q(el, 'compile-queue')!.textContent).toBe('1');
  });

  it('not loaded: explains, and the button asks to load', () => {
    const a = actions();
    const el = renderPanel(emptyState('not-loaded'), 'a.ipynb', a);
    expect(q(el, 'not-loaded')!.textContent).toContain('%load_ext neuron_lab');
    (q(el, 'load') as HTMLButtonElement).click();
    expect(a.load).toHaveBeenCalledTimes(1);
    expect(q(el, 'memory')).toBeNull();
  });

  it('no notebook: a hint and no button', () => {
    const el = renderPanel(null, '', actions());
    expect(q(el, 'placeholder')!.textContent).toContain('Open a notebook');
    expect(q(el, 'load')).toBeNull();
  });

  it('user text is never parsed as HTML', () => {
    const s = applyMessage(emptyState(), snapshot({ fallbacks: [fallbackRow('aten::x', { reason: '<img src=x onerror=alert(1)>' })] }));
    const el = renderPanel(s, 'a.ipynb', actions());
    expect(el.querySelector('img')).toBeNull();
    expect(q(el, 'reason')!.textContent).toContain('<img');
  });
});

describe('format', () => {
  it('formats bytes, shares, durations and locations', () => {
    expect(bytes(0)).toBe('0 B');
    expect(bytes(4 << 20)).toBe('4.00 MiB');
    expect(bytes(NaN)).toBe('–');
    expect(pct(0.0004)).toBe('<0.1%');
    expect(pct(0.123)).toBe('12%');
    expect(seconds(0.0123)).toBe('12 ms');
    expect(seconds(125)).toBe('2 min 5 s');
    expect(location('/home/me/project/src/train.py:12')).toBe('…/train.py:12');
  });
});
