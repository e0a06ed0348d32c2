/**
 * The side panel's lifecycle: one widget in the right sidebar, restored on reload, showing
 * whatever model the tracker says is current.
 *
 * It listens to two things only: the tracker's `currentChanged` (the user switched or
 * closed a notebook) and the current model's `stateChanged` (a message arrived or the
 * connection changed). Both just request an update; Lumino coalesces update requests into
 * one render per animation frame, so a burst of pushes costs one redraw.
 */
import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { neuronIcon } from './icon';
import { NeuronModel } from './model';
import { ICurrent, KernelTracker } from './tracker';
import { renderPanel } from './widget';

export const PANEL_ID = 'neuron-lab-panel';
export const PANEL_RANK = 900;

export class NeuronPanel extends Widget {
  constructor(tracker: KernelTracker) {
    super();
    this.id = PANEL_ID;
    this.addClass('jp-NeuronLab');
    this.title.icon = neuronIcon;
    this.title.caption = 'neuron device: memory, fallbacks, timing';
    this._tracker = tracker;
    tracker.currentChanged.connect(this._onCurrent, this);
    this._onCurrent(tracker, tracker.current);
  }

  get model(): NeuronModel | null {
    return this._model;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._tracker.currentChanged.disconnect(this._onCurrent, this);
    this._model?.stateChanged.disconnect(this._onState, this);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    this.update();
  }

  protected onUpdateRequest(msg: Message): void {
    if (!this.isVisible) {
      return; // collapsed sidebar: nothing to draw; onAfterShow redraws
    }
    const model = this._model;
    const view = renderPanel(model ? model.state : null, this._label, {
      load: () => void model?.loadExtension(),
      refresh: () => model?.refresh()
    });
    this.node.replaceChildren(view);
  }

  private _onCurrent(_: KernelTracker, current: ICurrent): void {
    if (current.model !== this._model) {
      this._model?.stateChanged.disconnect(this._onState, this);
      this._model = current.model;
      this._model?.stateChanged.connect(this._onState, this);
    }
    this._label = current.label;
    this.update();
  }

  private _onState(): void {
    this.update();
  }

  private _tracker: KernelTracker;
  private _model: NeuronModel | null = null;
  private _label = '';
}

/** Put the panel into the right sidebar and register it with the layout restorer. */
export function addPanel(app: JupyterFrontEnd, tracker: KernelTracker, restorer: ILayoutRestorer | null): NeuronPanel {
  const panel = new NeuronPanel(tracker);
  app.shell.add(panel, 'right', { rank: PANEL_RANK });
  if (restorer) {
    restorer.add(panel, PANEL_ID);
  }
  return panel;
}
