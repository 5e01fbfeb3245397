package cakeys

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeops/nodeops/api/v1alpha1"
	"github.com/nodeops/nodeops/internal/host"
)

// NodeNameExtra is where the API server puts the node of the pod a token is bound to, in the
// authenticated user's extra (a kubelet's projected ServiceAccount token carries it).
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// LabelControlPlane marks control-plane nodes, as kubeadm sets it (plan.LabelControlPlane; this
// package does not import plan).
const LabelControlPlane = "node-role.kubernetes.io/control-plane"

// The server's own TLS identity, kept in the staging directory so that an agent restarted on the same
// node presents the certificate its task published.
const (
	serverCert = "server.crt"
	serverKey  = "server.key"
)

// maxBody bounds what Fetch reads: a few PEM files.
const maxBody = 1 << 20

// Server serves a control plane's staged authorities to the agents of the operation's other
// control planes. It holds no key in memory longer than one answer.
type Server struct {
	// Node is the serving agent's node.
	Node string
	// Files are its node's files (the staging directory).
	Files host.Files
	// Client is the serving agent's own: it creates TokenReviews and reads Nodes and NodeTasks.
	Client client.Client
	// AgentUser is the user the agents' tokens authenticate as, such as
	// system:serviceaccount:nodeops-system:nodeops-agent.
	AgentUser string
	// Advertise is the host:port other agents reach the server at, published in the generating task's status.
	Advertise string
	// Log receives each refusal and each answer, without token or key; nil logs nothing.
	Log func(string)

	mu       sync.Mutex
	identity *tls.Certificate
}

// Publish makes sure the server has its TLS identity (made once, kept 0600 in the staging
// directory) and says where and as whom it serves: what the generating task publishes.
func (s *Server) Publish() (v1alpha1.CertificateAuthorityServer, error) {
	if s.Advertise == "" {
		return v1alpha1.CertificateAuthorityServer{}, errors.New("this agent serves no certificate authorities: start it with --ca-server-address")
	}
	id, err := s.loadIdentity(true)
	if err != nil {
		return v1alpha1.CertificateAuthorityServer{}, err
	}
	return v1alpha1.CertificateAuthorityServer{Address: s.Advertise, CertificateSHA256: Fingerprint(id.Certificate[0])}, nil
}

// Fingerprint is the lowercase hex SHA-256 of a certificate's DER.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// loadIdentity reads the staged TLS identity, making it when create is set and none is staged.
func (s *Server) loadIdentity(create bool) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.identity != nil {
		return s.identity, nil
	}
	certPEM, cerr := s.Files.ReadFile(staged(serverCert))
	keyPEM, kerr := s.Files.ReadFile(staged(serverKey))
	if cerr != nil || kerr != nil {
		if !create {
			return nil, errors.New("no certificate authorities staged on this node")
		}
		var err error
		if certPEM, keyPEM, err = newServerIdentity(s.Node); err != nil {
			return nil, err
		}
		if err := s.Files.WriteFileAtomic(staged(serverKey), keyPEM, 0o600); err != nil {
			return nil, err
		}
		if err := s.Files.WriteFileAtomic(staged(serverCert), certPEM, 0o644); err != nil {
			return nil, err
		}
	}
	id, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the staged server identity: %w", err)
	}
	s.identity = &id
	return s.identity, nil
}

func newServerIdentity(node string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 63))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "nodeops-agent-ca-server " + node},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// Serve answers on l until ctx ends. Before its identity is published it answers no handshake.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.loadIdentity(false)
		}},
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	err := srv.ServeTLS(l, "", "")
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Path is where the server answers for an operation's authorities.
func Path(operation string) string {
	return "/v1alpha1/operations/" + url.PathEscape(operation) + "/authorities"
}

// ServeHTTP answers GET Path(operation)?authorities=...&serviceAccountKey=true for an authorized agent.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op, ok := strings.CutPrefix(r.URL.Path, "/v1alpha1/operations/")
	op, ok2 := strings.CutSuffix(op, "/authorities")
	if r.Method != http.MethodGet || !ok || !ok2 || op == "" || strings.Contains(op, "/") {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		s.refuse(w, http.StatusUnauthorized, op, "", "no bearer token")
		return
	}
	node, code, err := s.Authorize(r.Context(), token, op)
	if err != nil {
		s.refuse(w, code, op, node, err.Error())
		return
	}
	var auth []string
	if a := r.URL.Query().Get("authorities"); a != "" {
		auth = strings.Split(a, ",")
	}
	sa, _ := strconv.ParseBool(r.URL.Query().Get("serviceAccountKey"))
	files, err := Read(s.Files, op, auth, sa)
	if err != nil {
		s.refuse(w, http.StatusConflict, op, node, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(files)
	s.log(fmt.Sprintf("served the staged authorities of operation %s to the agent of node %s", op, node))
}

func (s *Server) refuse(w http.ResponseWriter, code int, op, node, why string) {
	s.log(fmt.Sprintf("refused the authorities of operation %s to node %q: %s", op, node, why))
	http.Error(w, why, code)
}

func (s *Server) log(m string) {
	if s.Log != nil {
		s.Log(m)
	}
}

// Authorize says which node's agent presents token and whether it may have operation's
// authorities: the token must be an agent's, bound to a pod on one node (TokenReview), that node must
// be another control plane, and it must run an unfinished copyCertificateAuthorities task of the
// operation. The status code is the answer's when it may not.
func (s *Server) Authorize(ctx context.Context, token, operation string) (string, int, error) {
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if err := s.Client.Create(ctx, tr); err != nil {
		return "", http.StatusServiceUnavailable, fmt.Errorf("reviewing the token: %w", err)
	}
	if !tr.Status.Authenticated {
		return "", http.StatusUnauthorized, errors.New("the token does not authenticate")
	}
	u := tr.Status.User
	if u.Username != s.AgentUser {
		return "", http.StatusForbidden, fmt.Errorf("user %q is not nodeops' agent", u.Username)
	}
	nodes := u.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", http.StatusForbidden, errors.New("the token is bound to no pod on a node")
	}
	node := nodes[0]
	if node == s.Node {
		return node, http.StatusForbidden, errors.New("the node asking is the node serving")
	}
	n := &corev1.Node{}
	if err := s.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		return node, http.StatusForbidden, fmt.Errorf("reading node %s: %w", node, err)
	}
	if _, ok := n.Labels[LabelControlPlane]; !ok {
		return node, http.StatusForbidden, fmt.Errorf("node %s is no control plane", node)
	}
	tasks := &v1alpha1.NodeTaskList{}
	if err := s.Client.List(ctx, tasks, client.MatchingLabels{v1alpha1.LabelOperation: operation, v1alpha1.LabelNode: node}); err != nil {
		return node, http.StatusServiceUnavailable, fmt.Errorf("listing the operation's tasks: %w", err)
	}
	for _, t := range tasks.Items {
		if t.Spec.NodeName != node || t.Spec.Operation != operation || !t.Status.Phase.Unfinished() {
			continue
		}
		for _, c := range t.Spec.Commands {
			if c.CopyCertificateAuthorities != nil {
				return node, 0, nil
			}
		}
	}
	return node, http.StatusForbidden, fmt.Errorf("node %s has no unfinished copyCertificateAuthorities task of operation %s", node, operation)
}

// Fetch asks the server at srv for operation's authorities, accepting only the server certificate
// whose fingerprint srv names, and authenticating with token.
func Fetch(ctx context.Context, srv v1alpha1.CertificateAuthorityServer, operation string, authorities []string, sa bool, token string) ([]File, error) {
	want := strings.ToLower(srv.CertificateSHA256)
	tr := &http.Transport{
		Proxy: nil,
		TLSClientConfig: &tls.Config{
			MinVersion: tls.VersionTLS13,
			// The certificate is checked by its fingerprint below, not by a chain: it is self-signed,
			// and the fingerprint came from the generating agent's own task status, which only
			// that node's agent may write (agents confined to their own node, rule 10).
			InsecureSkipVerify: true, //nolint:gosec // pinned by VerifyPeerCertificate
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				if len(raw) == 0 || Fingerprint(raw[0]) != want {
					return fmt.Errorf("the server's certificate is not the one its task published (sha256 %s)", want)
				}
				return nil
			},
		},
	}
	defer tr.CloseIdleConnections()
	q := url.Values{}
	if len(authorities) > 0 {
		q.Set("authorities", strings.Join(authorities, ","))
	}
	if sa {
		q.Set("serviceAccountKey", "true")
	}
	u := url.URL{Scheme: "https", Host: srv.Address, Path: Path(operation), RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking %s for the authorities: %w", srv.Address, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &RefusedError{Code: resp.StatusCode, Message: strings.TrimSpace(string(body))}
	}
	var files []File
	if err := json.Unmarshal(body, &files); err != nil {
		return nil, fmt.Errorf("the answer of %s: %w", srv.Address, err)
	}
	return files, nil
}

// RefusedError is a server's refusal.
type RefusedError struct {
	Code    int
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the generating agent refused: %d %s: %s", e.Code, http.StatusText(e.Code), e.Message)
}
