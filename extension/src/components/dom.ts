/**
 * A tiny DOM builder for the rendering components: `h('div', {class: 'x'}, child, ...)`.
 *
 * Why not React: the panel is a handful of tables redrawn at the kernel's push rate; plain
 * DOM keeps the bundle small, needs no shared React singleton, and every string goes in
 * through `textContent` (fallback reasons and source lines come from user code, so nothing is
 * ever parsed as HTML).
 */

export type Child = Node | string | number | null | undefined | false;

export interface IProps {
  class?: string;
  title?: string;
  /** becomes `data-*` attributes; the e2e test reads `data-nl` */
  data?: Record<string, string | number>;
  onclick?: (ev: Event) => void;
  attrs?: Record<string, string>;
}

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: IProps | null = null,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (props) {
    if (props.class) {
      el.className = props.class;
    }
    if (props.title) {
      el.title = props.title;
    }
    for (const [k, v] of Object.entries(props.data ?? {})) {
      el.dataset[k] = String(v);
    }
    for (const [k, v] of Object.entries(props.attrs ?? {})) {
      el.setAttribute(k, v);
    }
    if (props.onclick) {
      el.addEventListener('click', props.onclick);
    }
  }
  append(el, children);
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

export function s(tag: string, attrs: Record<string, string | number> = {}, ...children: Element[]): SVGElement {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, String(v));
  }
  children.forEach(c => el.appendChild(c));
  return el;
}

export function append(el: Element, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) {
      continue;
    }
    el.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }
}

/** A titled section of the panel. */
export function section(name: string, title: string, ...body: Child[]): HTMLElement {
  return h(
    'section',
    { class: 'jp-NeuronLab-section', data: { nl: name } },
    h('h3', { class: 'jp-NeuronLab-sectionTitle' }, title),
    ...body
  );
}

/** A two-column list of label/value pairs; each value carries `data-nl=<key>`. */
export function stats(rows: [key: string, label: string, value: string, title?: string][]): HTMLElement {
  return h(
    'dl',
    { class: 'jp-NeuronLab-stats' },
    ...rows.flatMap(([key, label, value, title]) => [
      h('dt', null, label),
      h('dd', { data: { nl: key }, title }, value)
    ])
  );
}
