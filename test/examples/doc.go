// Package examples applies every YAML example the docs show (docs/examples, config/samples, hack/demo)
// to a real API server with nodeops' CRDs and admission policies, as a server-side dry run with strict
// field validation. It only reads those files and creates nothing that outlives its API server.
package examples
