/**
 * Number formatting for a narrow sidebar: short, unit-bearing, never `NaN`.
 * Bytes are binary (KiB, MiB) like `torch.cuda.memory_summary` and `metrics_report()`.
 */

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v.toFixed(0)} B` : `${v.toFixed(2)} ${units[i]}`;
}

export function pct(x: number | null | undefined): string {
  if (x === null || x === undefined || !Number.isFinite(x)) {
    return '–';
  }
  const p = x * 100;
  return p > 0 && p < 0.1 ? '<0.1%' : `${p.toFixed(p >= 10 ? 0 : 1)}%`;
}

export function seconds(s: number | null | undefined): string {
  if (s === null || s === undefined || !Number.isFinite(s)) {
    return '–';
  }
  if (s < 1e-3) {
    return s === 0 ? '0 s' : `${(s * 1e6).toFixed(0)} µs`;
  }
  if (s < 1) {
    return `${(s * 1e3).toFixed(0)} ms`;
  }
  if (s < 60) {
    return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  }
  const m = Math.floor(s / 60);
  return `${m} min ${Math.round(s - m * 60)} s`;
}

export function count(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) {
    return '–';
  }
  const a = Math.abs(n);
  if (a >= 1e9) {
    return `${(n / 1e9).toFixed(1)}G`;
  }
  if (a >= 1e6) {
    return `${(n / 1e6).toFixed(1)}M`;
  }
  if (a >= 1e4) {
    return `${(n / 1e3).toFixed(1)}k`;
  }
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

/** `/very/long/path/to/train.py:12` -> `train.py:12`; kernel cell files stay as they are. */
export function location(loc: string): string {
  const m = /^(.*?)(:\d+)?$/.exec(loc);
  if (!m) {
    return loc;
  }
  const [, file, line = ''] = m;
  const parts = file.split(/[\\/]/);
  if (parts.length <= 2) {
    return loc;
  }
  return `…/${parts[parts.length - 1]}${line}`;
}
