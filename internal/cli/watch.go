package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"

	nodeopsv1 "github.com/nodeops/nodeops/api/v1alpha1"
)

func newWatchCommand(o *Options) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "watch NAME",
		Short: "Follow an operation live until it ends; the exit code says how it ended",
		Long: `Follow a node operation until it succeeds, fails, blocks or is aborted.

On a terminal: a progress bar per group (# done, x failed, > running, . pending) and
a line per running, failed or waiting node, redrawn in place. Otherwise (a pipe, a
CI log): a timestamped line each time the operation, a group or a node changes.

At the end it prints the outcome with the reason and message, and the failed nodes.
A Blocked operation ends the watch, unless a retry, skip or abort was already
requested and the manager has not acted on it yet. If the API server goes away (it
restarts during an upgrade of its own node), the watch says so on stderr and tries
again every quarter second for half a minute, then every second, until it answers or
--timeout passes.

Exit codes: 0 Succeeded, 2 Failed, 3 Blocked, 4 Aborted, 1 any other error
(including --timeout).`,
		Example: `  kubectl nodeops watch renew-certs-x7k2p

  # In a script: wait at most 20 minutes, then act on the outcome
  kubectl nodeops watch upgrade-v1-37-2-abcde --timeout 20m || echo "exit $?"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.NewClient()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			return o.runWatch(ctx, c, args[0], timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "Give up after this long (exit code 1); 0 waits for ever")
	return cmd
}

// runWatch follows the operation; it returns nil on Succeeded and an *ExitError otherwise.
func (o *Options) runWatch(ctx context.Context, c Client, name string, timeout time.Duration) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	src, err := newOpSource(ctx, c, name)
	if err != nil {
		return err
	}
	defer src.stop()

	isTTY, width, height := o.Terminal()
	var tty *ttyRenderer
	var plain *plainRenderer
	if isTTY {
		tty = &ttyRenderer{w: o.Out, width: width, height: height}
		tty.start()
		defer tty.stop()
	} else {
		plain = &plainRenderer{w: o.Out, now: o.Now, last: map[string]string{}}
	}
	draw := func() {
		op, tasks := src.snapshot()
		if tty != nil {
			if ok, w, h := o.Terminal(); ok {
				tty.width, tty.height = w, h
			}
			tty.draw(buildView(op, tasks, o.Now()))
		} else {
			plain.draw(op, tasks)
		}
	}

	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	dirty, lastDraw := true, time.Time{}
	// lost: a watch ended and could not be re-listed (the API server restarts, as during an
	// upgrade of the control plane it runs on); the watch tries again (retryDue) until it answers.
	var lost error
	var lostAt, lastTry time.Time
	for {
		op, tasks := src.snapshot()
		if res := operationOutcome(op, tasks); res != nil {
			// The operation's last event can arrive before its tasks' (two watches): read the tasks
			// once more so the last lines show the node that failed, not the moment before.
			if src.relistTasks(ctx) == nil {
				op, tasks = src.snapshot()
			}
			draw()
			if tty != nil {
				tty.stop()
			}
			fmt.Fprintln(o.Out, res.text(op, tasks))
			if res.code == CodeSucceeded {
				return nil
			}
			return &ExitError{Code: res.code, Msg: string(res.phase), Silent: true}
		}
		if (dirty && time.Since(lastDraw) >= 200*time.Millisecond) || (tty != nil && time.Since(lastDraw) >= time.Second) {
			draw()
			dirty, lastDraw = false, time.Now()
		}

		var changed bool
		var ev watch.Event
		var ok bool
		err = nil
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return &ExitError{Code: CodeError, Msg: fmt.Sprintf("nodeoperation %s still %s after %s", name, phaseOf(src.op), timeout)}
			}
			return &ExitError{Code: CodeError, Msg: "interrupted"}
		case ev, ok = <-resultChan(src.opW):
			changed, err = src.applyOperationEvent(ctx, ev, ok)
		case ev, ok = <-resultChan(src.taskW):
			changed, err = src.applyTaskEvent(ctx, ev, ok)
		case <-tick.C:
			if lost != nil && retryDue(time.Since(lostAt), time.Since(lastTry)) {
				lastTry = time.Now()
				changed, err = true, src.reconnect(ctx)
				if err == nil {
					fmt.Fprintf(o.ErrOut, "watch: the API server answers again; following nodeoperation %s\n", name)
					lost = nil
				}
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			if errors.Is(err, errOperationGone) {
				return fmt.Errorf("nodeoperation %s: %w", name, err)
			}
			// A watch ended and the list after it failed. A starting API server refuses requests
			// until its authorizer is ready (forbidden, unauthorized), so even a refusal is waited
			// out for a while; a connection error or a server error for as long as it lasts.
			if lost == nil {
				fmt.Fprintf(o.ErrOut, "watch: lost the API server (%v); trying again\n", err)
				lostAt, lastTry = time.Now(), time.Now()
			} else if lost.Error() != err.Error() {
				fmt.Fprintf(o.ErrOut, "watch: the API server is not back yet (%v)\n", err)
			}
			if !retriable(err) && time.Since(lostAt) > refusalGrace {
				return err
			}
			lost = err
		}
		dirty = dirty || changed
	}
}

// retryDue says whether a watch that lost the API server lostFor ago, and last tried sinceTry ago,
// tries again at this tick: at every tick (a quarter second) for the first half minute, which a
// single control plane's API server needs to start again, so that the person sees the operation's
// end within a quarter second of it; then every second.
func retryDue(lostFor, sinceTry time.Duration) bool {
	return lostFor < 30*time.Second || sinceTry >= time.Second
}

// resultChan is w's channel; nil (never ready) while the watch is down.
func resultChan(w watch.Interface) <-chan watch.Event {
	if w == nil {
		return nil
	}
	return w.ResultChan()
}

// refusalGrace is how long a watch that lost the API server waits out refusals (forbidden,
// unauthorized, not found) from it before it gives up: a restarted API server refuses until its
// authorizer has caught up, seconds on a healthy node.
const refusalGrace = 2 * time.Minute

// retriable reports whether a failed list or watch may work when tried again: connection errors,
// timeouts and server errors may; an answer that the request itself is wrong or refused will not.
func retriable(err error) bool {
	switch {
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err), apierrors.IsUnauthorized(err),
		apierrors.IsBadRequest(err), apierrors.IsInvalid(err), apierrors.IsMethodNotSupported(err):
		return false
	}
	return true
}

// phaseExit maps a finished phase to the exit code `watch` uses.
func phaseExit(p nodeopsv1.OperationPhase) int {
	switch p {
	case nodeopsv1.OperationSucceeded:
		return CodeSucceeded
	case nodeopsv1.OperationFailed:
		return CodeFailed
	case nodeopsv1.OperationBlocked:
		return CodeBlocked
	case nodeopsv1.OperationAborted:
		return CodeAborted
	}
	return CodeError
}
