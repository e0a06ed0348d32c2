/**
 * Follows the notebook the user is looking at, and that notebook's kernel.
 *
 * One `NeuronModel` per notebook (created when the notebook first becomes current), so
 * switching between notebooks keeps each one's timeline and fallbacks instead of starting
 * over; a background notebook's comm stays open (the kernel pushes only while a cell runs,
 * so an idle comm costs nothing). A model follows its notebook's `kernelChanged` (kernel
 * switch, first start, shutdown) and is disposed with the notebook. The panel only ever
 * sees `current` and `currentChanged`.
 */
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IModelOptions, NeuronModel } from './model';
import { ILimits } from './state';

export interface ICurrent {
  model: NeuronModel | null;
  /** the notebook the model belongs to (the panel scrolls it to a cell location) */
  notebook: NotebookPanel | null;
  /** the notebook's name, for the panel header */
  label: string;
}

export class KernelTracker implements IDisposable {
  constructor(notebooks: INotebookTracker, options: IModelOptions = {}) {
    this._notebooks = notebooks;
    this._options = { ...options };
    notebooks.currentChanged.connect(this._onCurrent, this);
    this._onCurrent(notebooks, notebooks.currentWidget);
  }

  get current(): ICurrent {
    return this._current;
  }

  get currentChanged(): ISignal<this, ICurrent> {
    return this._currentChanged;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** The number of notebooks with a live model (for tests and diagnostics). */
  get size(): number {
    return this._models.size;
  }

  setRate(hz: number): void {
    this._options.rateHz = hz;
    this._models.forEach(m => m.setRate(hz));
  }

  setLimits(limits: Partial<ILimits>): void {
    this._options.limits = { ...this._options.limits, ...limits };
    this._models.forEach(m => m.setLimits(limits));
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._notebooks.currentChanged.disconnect(this._onCurrent, this);
    this._models.forEach(m => m.dispose());
    this._models.clear();
    Signal.clearData(this);
  }

  private _onCurrent(_: INotebookTracker, panel: NotebookPanel | null): void {
    if (this._disposed) {
      return;
    }
    if (panel?.isDisposed) {
      panel = null; // a notebook closing: the tracker moves on after its disposed signal
    }
    const model = panel ? this._modelFor(panel) : null;
    const label = panel ? panel.title.label || panel.context.path : '';
    if (model === this._current.model && label === this._current.label) {
      return;
    }
    this._current = { model, notebook: panel, label };
    this._currentChanged.emit(this._current);
  }

  private _modelFor(panel: NotebookPanel): NeuronModel {
    const existing = this._models.get(panel);
    if (existing) {
      return existing;
    }
    const model = new NeuronModel(this._options);
    this._models.set(panel, model);
    const ctx = panel.sessionContext;
    const follow = () => model.setKernel(ctx.session?.kernel ?? null);
    ctx.kernelChanged.connect(follow);
    follow();
    const relabel = () => {
      if (this._notebooks.currentWidget === panel) {
        this._onCurrent(this._notebooks, panel);
      }
    };
    panel.title.changed.connect(relabel);
    panel.disposed.connect(() => {
      ctx.kernelChanged.disconnect(follow);
      this._models.delete(panel);
      model.dispose();
      if (this._current.model === model) {
        this._onCurrent(this._notebooks, this._notebooks.currentWidget);
      }
    });
    return model;
  }

  private _notebooks: INotebookTracker;
  private _options: IModelOptions;
  private _models = new Map<NotebookPanel, NeuronModel>();
  private _current: ICurrent = { model: null, notebook: null, label: '' };
  private _currentChanged = new Signal<this, ICurrent>(this);
  private _disposed = false;
}
