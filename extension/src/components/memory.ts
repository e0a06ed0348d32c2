/**
 * Device memory: allocated / reserved / peak against the modelled capacity, and a timeline.
 *
 * The bars are shares of capacity (the number a user compares with "will it fit"); the
 * timeline is scaled to its own maximum instead, because a few MiB against 96 GiB would be a
 * flat line. The timeline's x axis is sample order (the kernel samples at the push rate only
 * while a cell runs, so idle time is not drawn).
 */
import { IMemoryNow } from '../state';
import { bytes, pct } from './format';
import { h, s, section } from './dom';

export function renderMemory(mem: IMemoryNow | null, timeline: number[]): HTMLElement {
  if (!mem) {
    return section('memory', 'Device memory', h('p', { class: 'jp-NeuronLab-empty' }, 'no memory sample yet'));
  }
  const cap = mem.capacity > 0 ? mem.capacity : 0;
  const row = (key: string, label: string, value: number) =>
    h(
      'div',
      { class: 'jp-NeuronLab-meter', title: `${label}: ${value} bytes` },
      h('span', { class: 'jp-NeuronLab-meterLabel' }, label),
      h('span', { class: 'jp-NeuronLab-meterValue', data: { nl: key, bytes: value } }, bytes(value)),
      h(
        'span',
        { class: 'jp-NeuronLab-bar' },
        h('span', { class: `jp-NeuronLab-barFill jp-mod-${key}`, attrs: { style: `width: ${barWidth(value, cap)}%` } })
      )
    );
  return section(
    'memory',
    'Device memory',
    row('allocated', 'allocated', mem.allocated),
    row('reserved', 'reserved', mem.reserved),
    row('peak', 'peak', mem.peak),
    h(
      'div',
      { class: 'jp-NeuronLab-capacity' },
      'capacity ',
      h('span', { data: { nl: 'capacity', bytes: cap } }, bytes(cap)),
      cap ? ` · ${pct(mem.allocated / cap)} used` : ''
    ),
    renderTimeline(timeline, mem.peak)
  );
}

function barWidth(v: number, cap: number): string {
  if (!cap || v <= 0) {
    return '0';
  }
  return Math.min(100, Math.max(0.5, (100 * v) / cap)).toFixed(2); // a sliver stays visible
}

const W = 200;
const H = 40;

export function renderTimeline(values: number[], peak: number): HTMLElement {
  const top = Math.max(peak, ...values, 1);
  const n = values.length;
  const x = (i: number) => (n <= 1 ? W : (i * W) / (n - 1));
  const y = (v: number) => H - 1 - (v / top) * (H - 2);
  const pts = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`);
  if (n === 1) {
    pts.unshift(`0,${y(values[0]).toFixed(1)}`);
  }
  const svg = s(
    'svg',
    { class: 'jp-NeuronLab-timeline', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img' },
    s('line', { class: 'jp-NeuronLab-timelinePeak', x1: 0, x2: W, y1: y(peak), y2: y(peak) }),
    ...(pts.length
      ? [
          s('polygon', { class: 'jp-NeuronLab-timelineArea', points: `0,${H} ${pts.join(' ')} ${W},${H}` }),
          s('polyline', { class: 'jp-NeuronLab-timelineLine', points: pts.join(' ') })
        ]
      : [])
  );
  svg.setAttribute('aria-label', `allocated memory over the last ${n} samples, peak ${bytes(peak)}`);
  return h(
    'div',
    { class: 'jp-NeuronLab-timelineBox', title: `last ${n} samples; dashed line: peak ${bytes(peak)}` },
    svg,
    h('div', { class: 'jp-NeuronLab-timelineAxis' }, h('span', null, `${n} sample${n === 1 ? '' : 's'}`), h('span', null, `max ${bytes(top)}`))
  );
}
