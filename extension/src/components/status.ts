/**
 * The panel's header (notebook, kernel state, executor/mode/rate) and the views shown instead
 * of data: no notebook, connecting, and "neuron_lab is not loaded" with the one button that
 * runs `%load_ext neuron_lab` in that kernel.
 */
import { IState, Status } from '../state';
import { h } from './dom';

const STATUS_TEXT: Record<Status, string> = {
  'no-kernel': 'no kernel',
  connecting: 'connecting…',
  'not-loaded': 'not loaded',
  loading: 'loading…',
  live: 'live',
  restarting: 'kernel restarting…',
  dead: 'kernel dead'
};

export interface IHeaderActions {
  refresh(): void;
}

export function renderHeader(state: IState, label: string, actions: IHeaderActions): HTMLElement {
  const hello = state.hello;
  const busy = !!state.running?.cell_id;
  return h(
    'header',
    { class: 'jp-NeuronLab-header' },
    h(
      'div',
      { class: 'jp-NeuronLab-headerRow' },
      h('span', { class: 'jp-NeuronLab-notebook', title: label, data: { nl: 'notebook' } }, label || 'no notebook'),
      h(
        'span',
        { class: `jp-NeuronLab-badge jp-mod-${state.status}${busy ? ' jp-mod-busy' : ''}`, data: { nl: 'status' } },
        busy ? 'running' : STATUS_TEXT[state.status]
      ),
      state.status === 'live'
        ? h(
            'button',
            { class: 'jp-NeuronLab-iconButton', title: 'Ask the kernel for a full snapshot', onclick: () => actions.refresh() },
            '↻'
          )
        : null
    ),
    hello
      ? h(
          'div',
          { class: 'jp-NeuronLab-sub', data: { nl: 'hello' } },
          `neuron:0 ${hello.chip ?? 'Trainium2'} on ${hello.executor} · ${hello.mode} · ${hello.push_hz} Hz · neuron_lab ${hello.neuron_lab}`
        )
      : null,
    renderRank(state),
    state.versionWarning ? h('div', { class: 'jp-NeuronLab-warn' }, state.versionWarning) : null,
    state.lastError ? h('div', { class: 'jp-NeuronLab-error', data: { nl: 'error' } }, state.lastError) : null
  );
}

/** "rank 1 of 2 · neuron:neuron · 30 collectives" when the kernel is part of a distributed job. */
function renderRank(state: IState): HTMLElement | null {
  const d = state.distributed;
  if (!d || (d.world_size <= 1 && !d.backend)) {
    return null;
  }
  const parts = [`rank ${d.rank} of ${d.world_size}`];
  if (d.backend) {
    parts.push(d.backend);
  }
  parts.push(`${d.collectives} collective${d.collectives === 1 ? '' : 's'}`);
  return h('div', { class: 'jp-NeuronLab-sub', data: { nl: 'rank' } }, parts.join(' · '));
}

export interface INotLoadedActions {
  load(): void;
}

/** What to show instead of data, or null when there is data to show. */
export function renderPlaceholder(state: IState, hasNotebook: boolean, actions: INotLoadedActions): HTMLElement | null {
  if (!hasNotebook) {
    return message('Open a notebook: this panel shows the neuron device of the notebook you are looking at.');
  }
  switch (state.status) {
    case 'live':
      return null;
    case 'no-kernel':
      return message('This notebook has no kernel. Start one to see its neuron device.');
    case 'dead':
      return message('The kernel died. Restart it or pick another kernel.');
    case 'restarting':
      return message('The kernel is restarting…');
    case 'connecting':
      return message('Connecting to the kernel…');
    case 'not-loaded':
    case 'loading':
      return renderNotLoaded(state.status === 'loading', actions);
  }
}

function renderNotLoaded(loading: boolean, actions: INotLoadedActions): HTMLElement {
  return h(
    'div',
    { class: 'jp-NeuronLab-notLoaded', data: { nl: 'not-loaded' } },
    h('p', null, 'neuron_lab is not loaded in this kernel.'),
    h(
      'p',
      { class: 'jp-NeuronLab-hint' },
      'The panel reads the kernel through the ',
      h('code', null, 'neuron_lab'),
      ' comm, which ',
      h('code', null, '%load_ext neuron_lab'),
      ' registers. Loading it runs that one line in this kernel; nothing else is ever executed from here.'
    ),
    h(
      'button',
      {
        class: 'jp-Button jp-mod-styled jp-mod-accept jp-NeuronLab-load',
        data: { nl: 'load' },
        onclick: () => actions.load(),
        attrs: loading ? { disabled: 'true' } : {}
      },
      loading ? 'Loading…' : 'Load neuron_lab'
    )
  );
}

function message(text: string): HTMLElement {
  return h('div', { class: 'jp-NeuronLab-placeholder', data: { nl: 'placeholder' } }, text);
}
