package commands

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/cakeys"
)

// CAServer publishes where the agent serves a rotation's staged authorities (cakeys.Server).
type CAServer interface {
	Publish() (v1alpha1.CertificateAuthorityServer, error)
}

// runGenerateCertificateAuthorities makes the new authorities in the staging directory and publishes
// the agent's server for them; the keys stay on the node (rule 15): the result holds fingerprints only.
func runGenerateCertificateAuthorities(_ context.Context, env *Env, c *v1alpha1.GenerateCertificateAuthoritiesCommand) (Result, error) {
	if env.DryRun {
		// The dry-run host reports each file the run would write; no key is made to be thrown away.
		pairs, err := cakeys.Pairs(c.Authorities, c.ServiceAccountKey)
		if err != nil {
			return Result{}, err
		}
		for _, p := range pairs {
			env.printf("dry run: would create %s/%s and %s/%s (mode 0600): new %s, self-signed (new issuer); nothing trusts it yet\n",
				v1alpha1.StagingDirectory, p.Cert, v1alpha1.StagingDirectory, p.Key, p.Name)
		}
		return Result{Message: "dry run: would generate " + strings.Join(names(pairs), ", ")}, nil
	}
	if env.CAServer == nil {
		return Result{}, errors.New("generateCertificateAuthorities: this agent serves no certificate authorities to the other control planes: start it with --ca-server-address")
	}
	g, err := cakeys.Generate(env.Host.Files, env.Operation, c.Authorities, c.ServiceAccountKey, time.Now())
	if err != nil {
		return Result{}, err
	}
	for _, l := range g.Lines {
		env.printf("%s\n", l)
	}
	srv, err := env.CAServer.Publish()
	if err != nil {
		return Result{}, err
	}
	msg := "generated " + listOrNone(g.Made)
	if len(g.Kept) > 0 {
		msg += ", kept " + strings.Join(g.Kept, ", ") + " from an earlier run"
	}
	return Result{Message: msg + "; serving them at " + srv.Address, CAServer: &srv}, nil
}

// runCopyCertificateAuthorities fetches the new authorities from the generating agent of the same
// operation into this node's staging directory.
func runCopyCertificateAuthorities(ctx context.Context, env *Env, c *v1alpha1.CopyCertificateAuthoritiesCommand) (Result, error) {
	if env.Client == nil {
		return Result{}, errors.New("copyCertificateAuthorities needs the agent's client")
	}
	src, node, err := generatingServer(ctx, env.Client, env.Operation)
	if err != nil {
		return Result{}, err
	}
	if env.DryRun {
		pairs, err := cakeys.Pairs(c.Authorities, c.ServiceAccountKey)
		if err != nil {
			return Result{}, err
		}
		for _, p := range pairs {
			env.printf("dry run: would copy %s/%s and %s/%s (mode 0600) from node %s: the new %s, self-signed (new issuer)\n",
				v1alpha1.StagingDirectory, p.Cert, v1alpha1.StagingDirectory, p.Key, node, p.Name)
		}
		return Result{Message: "dry run: would copy " + strings.Join(names(pairs), ", ") + " from node " + node}, nil
	}
	if env.ServiceAccountToken == nil {
		return Result{}, errors.New("copyCertificateAuthorities needs the agent's ServiceAccount token")
	}
	token, err := env.ServiceAccountToken()
	if err != nil {
		return Result{}, fmt.Errorf("reading the agent's ServiceAccount token: %w", err)
	}
	files, err := cakeys.Fetch(ctx, *src, env.Operation, c.Authorities, c.ServiceAccountKey, token)
	if err != nil {
		return Result{}, err
	}
	g, err := cakeys.Write(env.Host.Files, env.Operation, c.Authorities, c.ServiceAccountKey, files)
	if err != nil {
		return Result{}, err
	}
	for _, l := range g.Lines {
		env.printf("%s\n", l)
	}
	return Result{Message: "copied " + listOrNone(g.Made) + " from node " + node}, nil
}

// generatingServer is the server the operation's generating task published, and its node.
func generatingServer(ctx context.Context, c client.Client, operation string) (*v1alpha1.CertificateAuthorityServer, string, error) {
	tasks := &v1alpha1.NodeTaskList{}
	if err := c.List(ctx, tasks, client.MatchingLabels{v1alpha1.LabelOperation: operation}); err != nil {
		return nil, "", fmt.Errorf("listing the tasks of operation %s: %w", operation, err)
	}
	for _, t := range tasks.Items {
		if t.Spec.Operation != operation || t.Status.CertificateAuthorityServer == nil {
			continue
		}
		for _, cmd := range t.Spec.Commands {
			if cmd.GenerateCertificateAuthorities != nil {
				return t.Status.CertificateAuthorityServer.DeepCopy(), t.Spec.NodeName, nil
			}
		}
	}
	return nil, "", fmt.Errorf("no task of operation %s has generated the new authorities yet (generateCertificateAuthorities publishes its server in status.certificateAuthorityServer)", operation)
}

func names(pairs []cakeys.Pair) []string {
	out := make([]string, len(pairs))
	for i, p := range pairs {
		out[i] = p.Name
	}
	return out
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}

// notBuilt fails a command of a kind that is designed but not built; admission refuses such
// commands, so only a task made around admission reaches it.
func notBuilt(kind string) error {
	return fmt.Errorf("%s is not implemented yet: see docs/how-to/rotate-cas.md", kind)
}

func runTrustCertificateAuthorities(context.Context, *Env, *v1alpha1.TrustCertificateAuthoritiesCommand) (Result, error) {
	return Result{}, notBuilt("trustCertificateAuthorities")
}

func runPublishCertificateAuthorities(context.Context, *Env, *v1alpha1.PublishCertificateAuthoritiesCommand) (Result, error) {
	return Result{}, notBuilt("publishCertificateAuthorities")
}

func runReissueCertificates(context.Context, *Env, *v1alpha1.ReissueCertificatesCommand) (Result, error) {
	return Result{}, notBuilt("reissueCertificates")
}
