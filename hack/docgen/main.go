// Command docgen writes the reference pages under docs/reference from the code they describe: the
// API from api/v1alpha1, the CLI from kubectl-nodeops' cobra commands, the chart's values from its
// schema and values.yaml, and the metrics from internal/metrics' collectors. `make generate` runs
// it; its test fails when a committed page differs from what it would write.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	if err := write(*root); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}

// refDir is where the pages go, relative to the repository's root.
const refDir = "docs/reference"

// cliDir holds only generated pages: a page whose command is gone is removed.
const cliDir = refDir + "/cli"

// render returns every generated page by its path relative to the repository's root.
func render(root string) (map[string]string, error) {
	pages := map[string]string{}
	api, err := crdReference(filepath.Join(root, "api/v1alpha1"))
	if err != nil {
		return nil, fmt.Errorf("API reference: %w", err)
	}
	pages[refDir+"/api.md"] = api
	values, err := valuesReference(filepath.Join(root, "charts/nodeops/values.schema.json"), filepath.Join(root, "charts/nodeops/values.yaml"))
	if err != nil {
		return nil, fmt.Errorf("values reference: %w", err)
	}
	pages[refDir+"/values.md"] = values
	m, err := metricsReference()
	if err != nil {
		return nil, fmt.Errorf("metrics reference: %w", err)
	}
	pages[refDir+"/metrics.md"] = m
	cli, err := cliReference()
	if err != nil {
		return nil, fmt.Errorf("CLI reference: %w", err)
	}
	for name, page := range cli {
		pages[cliDir+"/"+name] = page
	}
	return pages, nil
}

func write(root string) error {
	pages, err := render(root)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(root, cliDir), 0o755); err != nil {
		return err
	}
	stale, err := filepath.Glob(filepath.Join(root, cliDir, "*.md"))
	if err != nil {
		return err
	}
	for _, f := range stale {
		rel, _ := filepath.Rel(root, f)
		if _, ok := pages[filepath.ToSlash(rel)]; !ok {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	paths := make([]string, 0, len(pages))
	for p := range pages {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := os.WriteFile(filepath.Join(root, p), []byte(pages[p]), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// generatedHeader opens every page: where it comes from, so nobody edits it by hand.
func generatedHeader(source string) string {
	return fmt.Sprintf("<!-- Generated from %s by hack/docgen (make generate). Do not edit. -->\n\n", source)
}

// escapeHTML keeps prose like "<operation>-<group>" visible: outside code spans, markdown would
// take it for an HTML tag.
func escapeHTML(s string) string {
	parts := strings.Split(s, "`")
	for i := 0; i < len(parts); i += 2 {
		parts[i] = strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(parts[i])
	}
	return strings.Join(parts, "`")
}
