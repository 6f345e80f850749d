// Command elasticgpu-testserver runs the real apiextensions-apiserver (the code
// that serves CustomResourceDefinitions inside kube-apiserver) on a real etcd,
// and additionally serves the core/v1 kinds (and a few other built-in groups)
// that controllers and tests need, through the generic registry of
// k8s.io/apiserver. It is a test fixture, not a production server: every
// authenticated (x509 client certificate) user is allowed everything.
//
// Built in GOPATH mode from Debian's golang-k8s-*-dev packages; see build.sh.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	goflag "flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/pflag"
	noopoteltrace "go.opentelemetry.io/otel/trace/noop"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver"
	aeoptions "k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	aeopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	webhookinit "k8s.io/apiserver/pkg/admission/plugin/webhook/initializer"
	"k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/names"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/kube-openapi/pkg/common"
	netutils "k8s.io/utils/net"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	coreopenapi "elasticgpu.local/testserver/openapi"
)

var (
	Scheme = apiserver.Scheme
	Codecs = apiserver.Codecs
)

func init() {
	utilruntime.Must(corev1.AddToScheme(Scheme))
	utilruntime.Must(coordinationv1.AddToScheme(Scheme))
	utilruntime.Must(admissionregistrationv1.AddToScheme(Scheme))
	utilruntime.Must(eventsv1.AddToScheme(Scheme))
}

// ---------------------------------------------------------------------------
// A generic strategy for built-in kinds.

type kind struct {
	gvk        schema.GroupVersionKind
	resource   string
	singular   string
	namespaced bool
	hasStatus  bool
	// keepStatusOnCreate: status given on create is kept (nodes); otherwise reset.
	keepStatusOnCreate bool
	newFunc            func() runtime.Object
	newListFunc        func() runtime.Object
	nameFn             apimachineryvalidation.ValidateNameFunc
	fields             func(obj runtime.Object) fields.Set
	prepareCreate      func(obj runtime.Object)
	prepareUpdate      func(obj, old runtime.Object)
	validate           func(obj runtime.Object) field.ErrorList
	validateUpdate     func(obj, old runtime.Object) field.ErrorList
	shortNames         []string
}

func (k *kind) gr() schema.GroupResource {
	return schema.GroupResource{Group: k.gvk.Group, Resource: k.resource}
}

func objectMeta(obj runtime.Object) *metav1.ObjectMeta {
	return reflect.ValueOf(obj).Elem().FieldByName("ObjectMeta").Addr().Interface().(*metav1.ObjectMeta)
}

func copyField(dst, src runtime.Object, name string) {
	reflect.ValueOf(dst).Elem().FieldByName(name).Set(reflect.ValueOf(src.DeepCopyObject()).Elem().FieldByName(name))
}

type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
	k      *kind
	status bool
}

func (s strategy) NamespaceScoped() bool { return s.k.namespaced }

func (s strategy) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	if s.k.hasStatus && !s.k.keepStatusOnCreate {
		st := reflect.ValueOf(obj).Elem().FieldByName("Status")
		st.Set(reflect.Zero(st.Type()))
	}
	if s.k.prepareCreate != nil {
		s.k.prepareCreate(obj)
	}
}

func (s strategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	if s.status {
		// Status updates change only the status (and labels/annotations, like kube-apiserver).
		oldCopy := old.DeepCopyObject()
		v := reflect.ValueOf(obj).Elem()
		ov := reflect.ValueOf(oldCopy).Elem()
		for i := 0; i < v.NumField(); i++ {
			switch v.Type().Field(i).Name {
			case "Status", "ObjectMeta", "TypeMeta":
			default:
				v.Field(i).Set(ov.Field(i))
			}
		}
		m, om := objectMeta(obj), objectMeta(oldCopy)
		m.OwnerReferences = om.OwnerReferences
		m.Finalizers = om.Finalizers
		m.DeletionTimestamp = om.DeletionTimestamp
		return
	}
	if s.k.hasStatus {
		copyField(obj, old, "Status")
	}
	if s.k.prepareUpdate != nil {
		s.k.prepareUpdate(obj, old)
	}
}

func (s strategy) Validate(ctx context.Context, obj runtime.Object) field.ErrorList {
	nameFn := s.k.nameFn
	if nameFn == nil {
		nameFn = apimachineryvalidation.NameIsDNSSubdomain
	}
	errs := apimachineryvalidation.ValidateObjectMeta(objectMeta(obj), s.k.namespaced, nameFn, field.NewPath("metadata"))
	if s.k.validate != nil {
		errs = append(errs, s.k.validate(obj)...)
	}
	return errs
}

func (s strategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	errs := apimachineryvalidation.ValidateObjectMetaUpdate(objectMeta(obj), objectMeta(old), field.NewPath("metadata"))
	if !s.status {
		if s.k.validate != nil {
			errs = append(errs, s.k.validate(obj)...)
		}
		if s.k.validateUpdate != nil {
			errs = append(errs, s.k.validateUpdate(obj, old)...)
		}
	}
	return errs
}

func (s strategy) WarningsOnCreate(ctx context.Context, obj runtime.Object) []string { return nil }
func (s strategy) WarningsOnUpdate(ctx context.Context, obj, old runtime.Object) []string {
	return nil
}
func (s strategy) Canonicalize(obj runtime.Object) {}
func (s strategy) AllowCreateOnUpdate() bool       { return false }
func (s strategy) AllowUnconditionalUpdate() bool  { return true }

func (s strategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	if !s.k.hasStatus {
		return nil
	}
	gv := fieldpath.APIVersion(s.k.gvk.GroupVersion().String())
	if s.status {
		return map[fieldpath.APIVersion]*fieldpath.Set{gv: fieldpath.NewSet(fieldpath.MakePathOrDie("spec"))}
	}
	return map[fieldpath.APIVersion]*fieldpath.Set{gv: fieldpath.NewSet(fieldpath.MakePathOrDie("status"))}
}

// REST wraps the store to provide short names.
type REST struct {
	*genericregistry.Store
	shortNames []string
}

func (r *REST) ShortNames() []string { return r.shortNames }

// StatusREST serves the status subresource.
type StatusREST struct {
	store *genericregistry.Store
}

func (r *StatusREST) New() runtime.Object { return r.store.New() }
func (r *StatusREST) Destroy()            {}
func (r *StatusREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, options)
}
func (r *StatusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return r.store.Update(ctx, name, objInfo, createValidation, updateValidation, false, options)
}
func (r *StatusREST) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return r.store.GetResetFields()
}
func (r *StatusREST) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	return r.store.ConvertToTable(ctx, object, tableOptions)
}

// BindingREST implements pods/binding (what schedulers use).
type BindingREST struct {
	store *genericregistry.Store
}

func (r *BindingREST) New() runtime.Object { return &corev1.Binding{} }
func (r *BindingREST) Destroy()            {}
func (r *BindingREST) NamespaceScoped() bool {
	return true
}
func (r *BindingREST) Create(ctx context.Context, name string, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	binding := obj.(*corev1.Binding)
	if binding.Name == "" {
		binding.Name = name
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	if binding.Target.Name == "" {
		return nil, apierrors.NewBadRequest("target.name is required")
	}
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	key, err := r.store.KeyFunc(ctx, binding.Name)
	if err != nil {
		return nil, err
	}
	var pre *storage.Preconditions
	if binding.UID != "" || binding.ResourceVersion != "" {
		pre = &storage.Preconditions{}
		if binding.UID != "" {
			pre.UID = &binding.UID
		}
		if binding.ResourceVersion != "" {
			pre.ResourceVersion = &binding.ResourceVersion
		}
	}
	out := &corev1.Pod{}
	err = r.store.Storage.GuaranteedUpdate(ctx, key, out, false, pre, storage.SimpleUpdate(func(o runtime.Object) (runtime.Object, error) {
		pod := o.(*corev1.Pod)
		if pod.DeletionTimestamp != nil {
			return nil, fmt.Errorf("pod %s is being deleted, cannot be assigned to a host", pod.Name)
		}
		if pod.Spec.NodeName != "" {
			return nil, apierrors.NewConflict(corev1.Resource("pods/binding"), pod.Name, fmt.Errorf("pod %v is already assigned to node %q", pod.Name, pod.Spec.NodeName))
		}
		pod.Spec.NodeName = binding.Target.Name
		setPodCondition(pod, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
		return pod, nil
	}), false, nil)
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil, err
		}
		if storage.IsNotFound(err) {
			return nil, apierrors.NewNotFound(corev1.Resource("pods"), binding.Name)
		}
		return nil, apierrors.NewInternalError(fmt.Errorf("binding %s/%s: %v", ns, binding.Name, err))
	}
	return &metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusCreated}, nil
}

func setPodCondition(pod *corev1.Pod, c corev1.PodCondition) {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == c.Type {
			pod.Status.Conditions[i] = c
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, c)
}

func newStore(k *kind, optsGetter generic.RESTOptionsGetter, scheme *runtime.Scheme) (*REST, *StatusREST, error) {
	s := strategy{ObjectTyper: scheme, NameGenerator: names.SimpleNameGenerator, k: k}
	getAttrs := func(obj runtime.Object) (labels.Set, fields.Set, error) {
		m := objectMeta(obj)
		fs := generic.ObjectMetaFieldsSet(m, k.namespaced)
		if k.fields != nil {
			fs = generic.MergeFieldsSets(fs, k.fields(obj))
		}
		return labels.Set(m.Labels), fs, nil
	}
	store := &genericregistry.Store{
		NewFunc:                   k.newFunc,
		NewListFunc:               k.newListFunc,
		DefaultQualifiedResource:  k.gr(),
		SingularQualifiedResource: schema.GroupResource{Group: k.gvk.Group, Resource: k.singular},
		PredicateFunc: func(label labels.Selector, field fields.Selector) storage.SelectionPredicate {
			return storage.SelectionPredicate{Label: label, Field: field, GetAttrs: getAttrs}
		},
		CreateStrategy:      s,
		UpdateStrategy:      s,
		DeleteStrategy:      s,
		ResetFieldsStrategy: s,
		TableConvertor:      rest.NewDefaultTableConvertor(k.gr()),
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: optsGetter, AttrFunc: getAttrs}); err != nil {
		return nil, nil, err
	}
	var status *StatusREST
	if k.hasStatus {
		st := *store
		ss := strategy{ObjectTyper: scheme, NameGenerator: names.SimpleNameGenerator, k: k, status: true}
		st.CreateStrategy = nil
		st.DeleteStrategy = nil
		st.UpdateStrategy = ss
		st.ResetFieldsStrategy = ss
		status = &StatusREST{store: &st}
	}
	// Field selectors beyond metadata.name/namespace must be registered in the scheme.
	if k.fields != nil {
		allowed := map[string]bool{"metadata.name": true}
		if k.namespaced {
			allowed["metadata.namespace"] = true
		}
		for f := range k.fields(k.newFunc()) {
			allowed[f] = true
		}
		utilruntime.Must(scheme.AddFieldLabelConversionFunc(k.gvk, func(label, value string) (string, string, error) {
			if allowed[label] {
				return label, value, nil
			}
			return "", "", fmt.Errorf("field label not supported: %s", label)
		}))
	}
	return &REST{Store: store, shortNames: k.shortNames}, status, nil
}

// ---------------------------------------------------------------------------
// Kind definitions.

func podDefaults(pod *corev1.Pod) {
	sp := &pod.Spec
	if sp.RestartPolicy == "" {
		sp.RestartPolicy = corev1.RestartPolicyAlways
	}
	if sp.DNSPolicy == "" {
		sp.DNSPolicy = corev1.DNSClusterFirst
	}
	if sp.SchedulerName == "" {
		sp.SchedulerName = corev1.DefaultSchedulerName
	}
	if sp.TerminationGracePeriodSeconds == nil {
		v := int64(corev1.DefaultTerminationGracePeriodSeconds)
		sp.TerminationGracePeriodSeconds = &v
	}
	if sp.SecurityContext == nil {
		sp.SecurityContext = &corev1.PodSecurityContext{}
	}
	if sp.ServiceAccountName == "" {
		sp.ServiceAccountName = "default"
	}
	if sp.DeprecatedServiceAccount == "" {
		sp.DeprecatedServiceAccount = sp.ServiceAccountName
	}
	if sp.EnableServiceLinks == nil {
		t := true
		sp.EnableServiceLinks = &t
	}
	if sp.Priority == nil {
		z := int32(0)
		sp.Priority = &z
	}
	def := func(cs []corev1.Container) {
		for i := range cs {
			c := &cs[i]
			if c.TerminationMessagePath == "" {
				c.TerminationMessagePath = corev1.TerminationMessagePathDefault
			}
			if c.TerminationMessagePolicy == "" {
				c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
			}
			if c.ImagePullPolicy == "" {
				img := c.Image
				if i := strings.LastIndex(img, "@"); i >= 0 {
					c.ImagePullPolicy = corev1.PullIfNotPresent
				} else if j := strings.LastIndex(img, ":"); j < 0 || strings.Contains(img[j:], "/") || strings.HasSuffix(img, ":latest") {
					c.ImagePullPolicy = corev1.PullAlways
				} else {
					c.ImagePullPolicy = corev1.PullIfNotPresent
				}
			}
			for p := range c.Ports {
				if c.Ports[p].Protocol == "" {
					c.Ports[p].Protocol = corev1.ProtocolTCP
				}
			}
		}
	}
	def(sp.InitContainers)
	def(sp.Containers)
}

func podQOS(pod *corev1.Pod) corev1.PodQOSClass {
	anyReq, guaranteed := false, true
	for _, c := range pod.Spec.Containers {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, hasReq := c.Resources.Requests[r]
			lim, hasLim := c.Resources.Limits[r]
			if hasReq || hasLim {
				anyReq = true
			}
			if !hasLim || (hasReq && req.Cmp(lim) != 0) {
				guaranteed = false
			}
		}
	}
	if !anyReq {
		return corev1.PodQOSBestEffort
	}
	if guaranteed {
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

var _ = resource.Quantity{}

func validatePod(obj runtime.Object) field.ErrorList {
	pod := obj.(*corev1.Pod)
	var errs field.ErrorList
	p := field.NewPath("spec")
	if len(pod.Spec.Containers) == 0 {
		errs = append(errs, field.Required(p.Child("containers"), ""))
	}
	seen := map[string]bool{}
	check := func(cs []corev1.Container, fp *field.Path) {
		for i, c := range cs {
			ip := fp.Index(i)
			if c.Name == "" {
				errs = append(errs, field.Required(ip.Child("name"), ""))
			} else {
				for _, msg := range apimachineryvalidation.NameIsDNSLabel(c.Name, false) {
					errs = append(errs, field.Invalid(ip.Child("name"), c.Name, msg))
				}
				if seen[c.Name] {
					errs = append(errs, field.Duplicate(ip.Child("name"), c.Name))
				}
				seen[c.Name] = true
			}
			if strings.TrimSpace(c.Image) == "" {
				errs = append(errs, field.Required(ip.Child("image"), ""))
			}
		}
	}
	check(pod.Spec.InitContainers, p.Child("initContainers"))
	check(pod.Spec.Containers, p.Child("containers"))
	return errs
}

func validatePodUpdate(obj, old runtime.Object) field.ErrorList {
	pod, oldPod := obj.(*corev1.Pod), old.(*corev1.Pod)
	// Like kube-apiserver: spec is immutable except images, activeDeadlineSeconds,
	// tolerations (additions) and schedulingGates (removals).
	mutated := oldPod.Spec.DeepCopy()
	if len(mutated.Containers) == len(pod.Spec.Containers) {
		for i := range mutated.Containers {
			mutated.Containers[i].Image = pod.Spec.Containers[i].Image
		}
	}
	if len(mutated.InitContainers) == len(pod.Spec.InitContainers) {
		for i := range mutated.InitContainers {
			mutated.InitContainers[i].Image = pod.Spec.InitContainers[i].Image
		}
	}
	mutated.ActiveDeadlineSeconds = pod.Spec.ActiveDeadlineSeconds
	mutated.Tolerations = pod.Spec.Tolerations
	mutated.SchedulingGates = pod.Spec.SchedulingGates
	if oldPod.Spec.NodeName == "" {
		mutated.NodeName = pod.Spec.NodeName
	}
	// Like kube-apiserver (KEP-3838): while the old pod is gated, nodeSelector and node affinity
	// may change. kube-apiserver allows only additions; tests/pods/conftest.py installs
	// ValidatingAdmissionPolicies that enforce exactly that, so this stays a plain copy here.
	if len(oldPod.Spec.SchedulingGates) > 0 {
		mutated.NodeSelector = pod.Spec.NodeSelector
		var nodeAffinity *corev1.NodeAffinity
		if pod.Spec.Affinity != nil {
			nodeAffinity = pod.Spec.Affinity.NodeAffinity
		}
		if mutated.Affinity == nil && nodeAffinity != nil {
			mutated.Affinity = &corev1.Affinity{}
		}
		if mutated.Affinity != nil {
			mutated.Affinity.NodeAffinity = nodeAffinity
			if *mutated.Affinity == (corev1.Affinity{}) && pod.Spec.Affinity == nil {
				mutated.Affinity = nil
			}
		}
	}
	if !equality.Semantic.DeepEqual(*mutated, pod.Spec) {
		return field.ErrorList{field.Forbidden(field.NewPath("spec"), "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)")}
	}
	return nil
}

func secretStringData(obj runtime.Object) {
	s := obj.(*corev1.Secret)
	if s.Type == "" {
		s.Type = corev1.SecretTypeOpaque
	}
	if len(s.StringData) > 0 {
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		for k, v := range s.StringData {
			s.Data[k] = []byte(v)
		}
		s.StringData = nil
	}
}

func defaultWebhookCommon(fp **admissionregistrationv1.FailurePolicyType, mp **admissionregistrationv1.MatchPolicyType, ns, os **metav1.LabelSelector, timeout **int32, rules []admissionregistrationv1.RuleWithOperations, cc *admissionregistrationv1.WebhookClientConfig) {
	if *fp == nil {
		v := admissionregistrationv1.Fail
		*fp = &v
	}
	if *mp == nil {
		v := admissionregistrationv1.Equivalent
		*mp = &v
	}
	if *ns == nil {
		*ns = &metav1.LabelSelector{}
	}
	if *os == nil {
		*os = &metav1.LabelSelector{}
	}
	if *timeout == nil {
		v := int32(10)
		*timeout = &v
	}
	for i := range rules {
		if rules[i].Scope == nil {
			v := admissionregistrationv1.AllScopes
			rules[i].Scope = &v
		}
	}
	if cc.Service != nil && cc.Service.Port == nil {
		v := int32(443)
		cc.Service.Port = &v
	}
}

func validateWebhooks(sideEffects []*admissionregistrationv1.SideEffectClass, versions [][]string, names []string, ccs []admissionregistrationv1.WebhookClientConfig) field.ErrorList {
	var errs field.ErrorList
	for i := range names {
		p := field.NewPath("webhooks").Index(i)
		if names[i] == "" {
			errs = append(errs, field.Required(p.Child("name"), ""))
		}
		if sideEffects[i] == nil {
			errs = append(errs, field.Required(p.Child("sideEffects"), "must specify one of None, NoneOnDryRun"))
		}
		if len(versions[i]) == 0 {
			errs = append(errs, field.Required(p.Child("admissionReviewVersions"), "must specify one of v1, v1beta1"))
		}
		if (ccs[i].URL == nil) == (ccs[i].Service == nil) {
			errs = append(errs, field.Required(p.Child("clientConfig"), "exactly one of url or service is required"))
		}
	}
	return errs
}

func kinds() []*kind {
	meta := func(obj runtime.Object) fields.Set { return fields.Set{} }
	_ = meta
	return []*kind{
		{
			gvk: corev1.SchemeGroupVersion.WithKind("Namespace"), resource: "namespaces", singular: "namespace",
			hasStatus: true, shortNames: []string{"ns"},
			newFunc: func() runtime.Object { return &corev1.Namespace{} }, newListFunc: func() runtime.Object { return &corev1.NamespaceList{} },
			nameFn: apimachineryvalidation.ValidateNamespaceName,
			fields: func(obj runtime.Object) fields.Set {
				return fields.Set{"status.phase": string(obj.(*corev1.Namespace).Status.Phase)}
			},
			prepareCreate: func(obj runtime.Object) {
				n := obj.(*corev1.Namespace)
				n.Status.Phase = corev1.NamespaceActive
				if n.Labels == nil {
					n.Labels = map[string]string{}
				}
				n.Labels[corev1.LabelMetadataName] = n.Name
			},
			prepareUpdate: func(obj, old runtime.Object) {
				n := obj.(*corev1.Namespace)
				if n.Labels == nil {
					n.Labels = map[string]string{}
				}
				n.Labels[corev1.LabelMetadataName] = n.Name
			},
		},
		{
			gvk: corev1.SchemeGroupVersion.WithKind("Pod"), resource: "pods", singular: "pod", namespaced: true,
			hasStatus: true, shortNames: []string{"po"},
			newFunc: func() runtime.Object { return &corev1.Pod{} }, newListFunc: func() runtime.Object { return &corev1.PodList{} },
			fields: func(obj runtime.Object) fields.Set {
				p := obj.(*corev1.Pod)
				return fields.Set{
					"spec.nodeName": p.Spec.NodeName, "spec.restartPolicy": string(p.Spec.RestartPolicy),
					"spec.schedulerName": p.Spec.SchedulerName, "spec.serviceAccountName": p.Spec.ServiceAccountName,
					"spec.hostNetwork": fmt.Sprint(p.Spec.HostNetwork),
					"status.phase":     string(p.Status.Phase), "status.podIP": p.Status.PodIP,
					"status.nominatedNodeName": p.Status.NominatedNodeName,
				}
			},
			prepareCreate: func(obj runtime.Object) {
				p := obj.(*corev1.Pod)
				podDefaults(p)
				p.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: podQOS(p)}
				if p.Spec.NodeName != "" {
					setPodCondition(p, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
				}
			},
			validate:       validatePod,
			validateUpdate: validatePodUpdate,
		},
		{
			gvk: corev1.SchemeGroupVersion.WithKind("Node"), resource: "nodes", singular: "node",
			hasStatus: true, keepStatusOnCreate: true, shortNames: []string{"no"},
			newFunc: func() runtime.Object { return &corev1.Node{} }, newListFunc: func() runtime.Object { return &corev1.NodeList{} },
			fields: func(obj runtime.Object) fields.Set {
				return fields.Set{"spec.unschedulable": fmt.Sprint(obj.(*corev1.Node).Spec.Unschedulable)}
			},
		},
		{
			gvk: corev1.SchemeGroupVersion.WithKind("Event"), resource: "events", singular: "event", namespaced: true,
			shortNames: []string{"ev"},
			newFunc:    func() runtime.Object { return &corev1.Event{} }, newListFunc: func() runtime.Object { return &corev1.EventList{} },
			fields: func(obj runtime.Object) fields.Set {
				e := obj.(*corev1.Event)
				return fields.Set{
					"involvedObject.kind": e.InvolvedObject.Kind, "involvedObject.namespace": e.InvolvedObject.Namespace,
					"involvedObject.name": e.InvolvedObject.Name, "involvedObject.uid": string(e.InvolvedObject.UID),
					"involvedObject.apiVersion": e.InvolvedObject.APIVersion, "involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
					"involvedObject.fieldPath": e.InvolvedObject.FieldPath, "reason": e.Reason, "reportingComponent": e.ReportingController,
					"source": e.Source.Component, "type": e.Type,
				}
			},
		},
		{
			gvk: corev1.SchemeGroupVersion.WithKind("ConfigMap"), resource: "configmaps", singular: "configmap", namespaced: true,
			shortNames: []string{"cm"},
			newFunc:    func() runtime.Object { return &corev1.ConfigMap{} }, newListFunc: func() runtime.Object { return &corev1.ConfigMapList{} },
		},
		{
			gvk: corev1.SchemeGroupVersion.WithKind("Secret"), resource: "secrets", singular: "secret", namespaced: true,
			newFunc: func() runtime.Object { return &corev1.Secret{} }, newListFunc: func() runtime.Object { return &corev1.SecretList{} },
			fields: func(obj runtime.Object) fields.Set {
				return fields.Set{"type": string(obj.(*corev1.Secret).Type)}
			},
			prepareCreate: secretStringData,
			prepareUpdate: func(obj, old runtime.Object) { secretStringData(obj) },
		},
		{
			gvk: corev1.SchemeGroupVersion.WithKind("ServiceAccount"), resource: "serviceaccounts", singular: "serviceaccount", namespaced: true,
			shortNames: []string{"sa"},
			newFunc:    func() runtime.Object { return &corev1.ServiceAccount{} }, newListFunc: func() runtime.Object { return &corev1.ServiceAccountList{} },
		},
		{
			gvk: coordinationv1.SchemeGroupVersion.WithKind("Lease"), resource: "leases", singular: "lease", namespaced: true,
			newFunc: func() runtime.Object { return &coordinationv1.Lease{} }, newListFunc: func() runtime.Object { return &coordinationv1.LeaseList{} },
		},
		{
			gvk: eventsv1.SchemeGroupVersion.WithKind("Event"), resource: "events", singular: "event", namespaced: true,
			newFunc: func() runtime.Object { return &eventsv1.Event{} }, newListFunc: func() runtime.Object { return &eventsv1.EventList{} },
		},
		{
			gvk: admissionregistrationv1.SchemeGroupVersion.WithKind("MutatingWebhookConfiguration"), resource: "mutatingwebhookconfigurations", singular: "mutatingwebhookconfiguration",
			newFunc:       func() runtime.Object { return &admissionregistrationv1.MutatingWebhookConfiguration{} },
			newListFunc:   func() runtime.Object { return &admissionregistrationv1.MutatingWebhookConfigurationList{} },
			prepareCreate: func(obj runtime.Object) { defaultMutating(obj) },
			prepareUpdate: func(obj, old runtime.Object) { defaultMutating(obj) },
			validate: func(obj runtime.Object) field.ErrorList {
				c := obj.(*admissionregistrationv1.MutatingWebhookConfiguration)
				var se []*admissionregistrationv1.SideEffectClass
				var vs [][]string
				var ns []string
				var ccs []admissionregistrationv1.WebhookClientConfig
				for _, w := range c.Webhooks {
					se, vs, ns, ccs = append(se, w.SideEffects), append(vs, w.AdmissionReviewVersions), append(ns, w.Name), append(ccs, w.ClientConfig)
				}
				return validateWebhooks(se, vs, ns, ccs)
			},
		},
		{
			gvk: admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfiguration"), resource: "validatingwebhookconfigurations", singular: "validatingwebhookconfiguration",
			newFunc:       func() runtime.Object { return &admissionregistrationv1.ValidatingWebhookConfiguration{} },
			newListFunc:   func() runtime.Object { return &admissionregistrationv1.ValidatingWebhookConfigurationList{} },
			prepareCreate: func(obj runtime.Object) { defaultValidating(obj) },
			prepareUpdate: func(obj, old runtime.Object) { defaultValidating(obj) },
			validate: func(obj runtime.Object) field.ErrorList {
				c := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
				var se []*admissionregistrationv1.SideEffectClass
				var vs [][]string
				var ns []string
				var ccs []admissionregistrationv1.WebhookClientConfig
				for _, w := range c.Webhooks {
					se, vs, ns, ccs = append(se, w.SideEffects), append(vs, w.AdmissionReviewVersions), append(ns, w.Name), append(ccs, w.ClientConfig)
				}
				return validateWebhooks(se, vs, ns, ccs)
			},
		},
		{
			gvk: admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingAdmissionPolicy"), resource: "validatingadmissionpolicies", singular: "validatingadmissionpolicy",
			hasStatus:     true,
			newFunc:       func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicy{} },
			newListFunc:   func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicyList{} },
			prepareCreate: func(obj runtime.Object) { defaultVAP(obj) },
			prepareUpdate: func(obj, old runtime.Object) { defaultVAP(obj) },
		},
		{
			gvk: admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingAdmissionPolicyBinding"), resource: "validatingadmissionpolicybindings", singular: "validatingadmissionpolicybinding",
			newFunc:       func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{} },
			newListFunc:   func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicyBindingList{} },
			prepareCreate: func(obj runtime.Object) { defaultVAPB(obj) },
			prepareUpdate: func(obj, old runtime.Object) { defaultVAPB(obj) },
		},
	}
}

func defaultMutating(obj runtime.Object) {
	c := obj.(*admissionregistrationv1.MutatingWebhookConfiguration)
	for i := range c.Webhooks {
		w := &c.Webhooks[i]
		defaultWebhookCommon(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector, &w.TimeoutSeconds, w.Rules, &w.ClientConfig)
		if w.ReinvocationPolicy == nil {
			v := admissionregistrationv1.NeverReinvocationPolicy
			w.ReinvocationPolicy = &v
		}
	}
}

func defaultValidating(obj runtime.Object) {
	c := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
	for i := range c.Webhooks {
		w := &c.Webhooks[i]
		defaultWebhookCommon(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector, &w.TimeoutSeconds, w.Rules, &w.ClientConfig)
	}
}

func defaultMatchResources(m *admissionregistrationv1.MatchResources) {
	if m == nil {
		return
	}
	if m.MatchPolicy == nil {
		v := admissionregistrationv1.Equivalent
		m.MatchPolicy = &v
	}
	if m.NamespaceSelector == nil {
		m.NamespaceSelector = &metav1.LabelSelector{}
	}
	if m.ObjectSelector == nil {
		m.ObjectSelector = &metav1.LabelSelector{}
	}
	for _, rs := range [][]admissionregistrationv1.NamedRuleWithOperations{m.ResourceRules, m.ExcludeResourceRules} {
		for i := range rs {
			if rs[i].Scope == nil {
				v := admissionregistrationv1.AllScopes
				rs[i].Scope = &v
			}
		}
	}
}

func defaultVAP(obj runtime.Object) {
	p := obj.(*admissionregistrationv1.ValidatingAdmissionPolicy)
	if p.Spec.FailurePolicy == nil {
		v := admissionregistrationv1.Fail
		p.Spec.FailurePolicy = &v
	}
	defaultMatchResources(p.Spec.MatchConstraints)
}

func defaultVAPB(obj runtime.Object) {
	b := obj.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding)
	defaultMatchResources(b.Spec.MatchResources)
	if b.Spec.ParamRef != nil && b.Spec.ParamRef.ParameterNotFoundAction == nil {
		v := admissionregistrationv1.DenyAction
		b.Spec.ParamRef.ParameterNotFoundAction = &v
	}
}

// ---------------------------------------------------------------------------
// HTTP wrappers.

// withSlashAndDiscoveryFixes strips trailing slashes (the Python client asks
// for /version/, Debian's go-restful 3.10 would 404 it) and serves the legacy
// (non-aggregated) /apis group list including CRD groups, which in
// kube-apiserver is the aggregator's job.
func withSlashAndDiscoveryFixes(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; len(p) > 1 && strings.HasSuffix(p, "/") {
			r2 := r.Clone(r.Context())
			r2.URL.Path = strings.TrimRight(p, "/")
			if r2.URL.Path == "" {
				r2.URL.Path = "/"
			}
			r2.URL.RawPath = ""
			r2.RequestURI = r2.URL.RequestURI()
			r = r2
		}
		if r.Method == http.MethodGet && r.URL.Path == "/apis" && !strings.Contains(r.Header.Get("Accept"), "apidiscovery.k8s.io") {
			legacyAPIs(h, w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func legacyAPIs(h http.Handler, w http.ResponseWriter, r *http.Request) {
	r2 := r.Clone(r.Context())
	r2.Header.Set("Accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
	r2.Header.Del("Accept-Encoding")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r2)
	if rec.Code != http.StatusOK {
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
		return
	}
	var agg apidiscoveryv2.APIGroupDiscoveryList
	if err := json.Unmarshal(rec.Body.Bytes(), &agg); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	list := metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{}}
	for _, g := range agg.Items {
		if len(g.Versions) == 0 {
			continue
		}
		grp := metav1.APIGroup{Name: g.Name}
		for _, v := range g.Versions {
			grp.Versions = append(grp.Versions, metav1.GroupVersionForDiscovery{GroupVersion: g.Name + "/" + v.Version, Version: v.Version})
		}
		grp.PreferredVersion = grp.Versions[0]
		list.Groups = append(list.Groups, grp)
	}
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(&list)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(buf.Bytes())
}

// ---------------------------------------------------------------------------

func main() {
	o := genericoptions.NewRecommendedOptions("/registry", Codecs.LegacyCodec(apiextensionsv1beta1.SchemeGroupVersion, apiextensionsv1.SchemeGroupVersion))
	runOpts := genericoptions.NewServerRunOptions()
	o.CoreAPI = nil
	o.Authentication = nil
	o.Authorization = nil
	admissionOpts := o.Admission
	o.Admission = nil
	o.Features.EnablePriorityAndFairness = false
	admissionOpts.DisablePlugins = []string{"MutatingAdmissionPolicy"}

	fs := pflag.CommandLine
	var clientCAFile string
	fs.StringVar(&clientCAFile, "client-ca-file", "", "CA bundle for x509 client-certificate authentication (required)")
	o.Etcd.AddFlags(fs)
	o.SecureServing.AddFlags(fs)
	admissionOpts.AddFlags(fs)
	runOpts.AddUniversalFlags(fs)
	gfs := goflag.NewFlagSet("klog", goflag.ExitOnError)
	klog.InitFlags(gfs)
	fs.AddGoFlagSet(gfs)
	pflag.Parse()

	if err := run(o, runOpts, admissionOpts, clientCAFile); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(o *genericoptions.RecommendedOptions, runOpts *genericoptions.ServerRunOptions, admissionOpts *genericoptions.AdmissionOptions, clientCAFile string) error {
	if clientCAFile == "" {
		return fmt.Errorf("--client-ca-file is required")
	}
	if err := runOpts.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	if err := runOpts.Complete(); err != nil {
		return err
	}
	if errs := o.Etcd.Validate(); len(errs) > 0 {
		return errs[0]
	}
	if err := o.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
		return err
	}

	serverConfig := genericapiserver.NewRecommendedConfig(Codecs)
	if err := runOpts.ApplyTo(&serverConfig.Config); err != nil {
		return err
	}
	if err := o.ApplyTo(serverConfig); err != nil {
		return err
	}
	serverConfig.MergedResourceConfig = apiserver.DefaultAPIResourceConfigSource()

	// Authentication: x509 client certificates; authorization: allow all.
	ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca", clientCAFile)
	if err != nil {
		return err
	}
	serverConfig.Authentication.Authenticator = x509.NewDynamic(ca.VerifyOptions, x509.CommonNameUserConversion)
	if err := serverConfig.Authentication.ApplyClientCert(ca, serverConfig.SecureServing); err != nil {
		return err
	}
	serverConfig.Authorization.Authorizer = authorizerfactory.NewAlwaysAllowAuthorizer()
	genericapiserver.AuthorizeClientBearerToken(serverConfig.LoopbackClientConfig, &serverConfig.Authentication, &serverConfig.Authorization)

	// Core API client = ourselves through loopback.
	serverConfig.ClientConfig = serverConfig.LoopbackClientConfig
	kubeClient, err := kubernetes.NewForConfig(serverConfig.LoopbackClientConfig)
	if err != nil {
		return err
	}
	dynClient, err := dynamic.NewForConfig(serverConfig.LoopbackClientConfig)
	if err != nil {
		return err
	}
	serverConfig.SharedInformerFactory = informers.NewSharedInformerFactory(kubeClient, 10*time.Minute)
	authWrapper := webhook.NewDefaultAuthenticationInfoResolverWrapper(nil, nil, serverConfig.LoopbackClientConfig, noopoteltrace.NewTracerProvider())
	serviceResolver := webhook.NewDefaultServiceResolver()
	if err := admissionOpts.ApplyTo(&serverConfig.Config, serverConfig.SharedInformerFactory, kubeClient, dynClient, utilfeature.DefaultFeatureGate,
		serverConfig.EffectiveVersion, webhookinit.NewPluginInitializer(authWrapper, serviceResolver)); err != nil {
		return err
	}

	defs := func(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
		m := aeopenapi.GetOpenAPIDefinitions(ref)
		for k, v := range coreopenapi.GetOpenAPIDefinitions(ref) {
			m[k] = v
		}
		return m
	}
	namer := openapinamer.NewDefinitionNamer(Scheme, clientscheme.Scheme)
	serverConfig.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(defs), namer)
	serverConfig.OpenAPIV3Config.Info.Title = "elasticgpu-testserver"
	serverConfig.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(defs), namer)
	serverConfig.OpenAPIConfig.Info.Title = "elasticgpu-testserver"

	serverConfig.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
		return withSlashAndDiscoveryFixes(genericapiserver.DefaultBuildHandlerChain(h, c))
	}

	config := &apiserver.Config{
		GenericConfig: serverConfig,
		ExtraConfig: apiserver.ExtraConfig{
			CRDRESTOptionsGetter: aeoptions.NewCRDRESTOptionsGetter(*o.Etcd, serverConfig.ResourceTransformers, serverConfig.StorageObjectCountTracker),
			ServiceResolver:      serviceResolver,
			AuthResolverWrapper:  authWrapper,
		},
	}

	// Storage for built-in kinds: JSON in etcd, versioned (these types have no internal version here).
	info, ok := runtime.SerializerInfoForMediaType(Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		return fmt.Errorf("no JSON serializer")
	}
	builtinGVs := schema.GroupVersions{corev1.SchemeGroupVersion, coordinationv1.SchemeGroupVersion, admissionregistrationv1.SchemeGroupVersion, eventsv1.SchemeGroupVersion}
	storageCfg := o.Etcd.StorageConfig
	storageCfg.Codec = Codecs.CodecForVersions(info.Serializer, info.Serializer, builtinGVs, builtinGVs)
	storageCfg.EncodeVersioner = builtinGVs
	etcdCopy := *o.Etcd
	etcdCopy.StorageConfig = storageCfg
	builtinGetter := etcdCopy.CreateRESTOptionsGetter(&genericoptions.SimpleStorageFactory{StorageConfig: storageCfg}, serverConfig.ResourceTransformers)

	completed := config.Complete()
	completed.GenericConfig.EnableDiscovery = true
	crdServer, err := completed.New(genericapiserver.NewEmptyDelegate())
	if err != nil {
		return err
	}
	s := crdServer.GenericAPIServer

	groups := map[string]*genericapiserver.APIGroupInfo{}
	var order []string
	for _, k := range kinds() {
		g := k.gvk.Group
		if groups[g] == nil {
			gi := genericapiserver.NewDefaultAPIGroupInfo(g, Scheme, metav1.ParameterCodec, Codecs)
			groups[g] = &gi
			order = append(order, g)
		}
		gi := groups[g]
		if gi.VersionedResourcesStorageMap[k.gvk.Version] == nil {
			gi.VersionedResourcesStorageMap[k.gvk.Version] = map[string]rest.Storage{}
		}
		// These types have no separate internal version: register the versioned
		// types as the internal (hub) version too, which server-side apply needs.
		Scheme.AddKnownTypes(schema.GroupVersion{Group: g, Version: runtime.APIVersionInternal}, k.newFunc(), k.newListFunc())
		store, status, err := newStore(k, builtinGetter, Scheme)
		if err != nil {
			return fmt.Errorf("%s: %w", k.resource, err)
		}
		m := gi.VersionedResourcesStorageMap[k.gvk.Version]
		m[k.resource] = store
		if status != nil {
			m[k.resource+"/status"] = status
		}
		if k.resource == "pods" {
			Scheme.AddKnownTypes(schema.GroupVersion{Group: g, Version: runtime.APIVersionInternal}, &corev1.Binding{})
			m["pods/binding"] = &BindingREST{store: store.Store}
		}
	}
	if err := s.InstallLegacyAPIGroup("/api", groups[""]); err != nil {
		return fmt.Errorf("install /api: %w", err)
	}
	var others []*genericapiserver.APIGroupInfo
	for _, g := range order {
		if g != "" {
			others = append(others, groups[g])
		}
	}
	if err := s.InstallAPIGroups(others...); err != nil {
		return fmt.Errorf("install groups: %w", err)
	}

	s.AddPostStartHookOrDie("elasticgpu-bootstrap-namespaces", func(ctx genericapiserver.PostStartHookContext) error {
		return wait.PollUntilContextCancel(ctx.Context, 200*time.Millisecond, true, func(c context.Context) (bool, error) {
			for _, n := range []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease} {
				_, err := kubeClient.CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
				if err != nil && !apierrors.IsAlreadyExists(err) {
					klog.V(2).Infof("bootstrap namespace %s: %v", n, err)
					return false, nil
				}
			}
			return true, nil
		})
	})
	s.AddPostStartHookOrDie("elasticgpu-namespace-controllers", func(ctx genericapiserver.PostStartHookContext) error {
		startNamespaceControllers(ctx.Context, kubeClient, dynClient)
		return nil
	})

	return s.PrepareRun().RunWithContext(genericapiserver.SetupSignalContext())
}

// startNamespaceControllers runs two tiny stand-ins for kube-controller-manager:
// a "default" ServiceAccount is created in every namespace, and the namespaced
// objects of a deleted namespace are deleted.
func startNamespaceControllers(ctx context.Context, kc kubernetes.Interface, dc dynamic.Interface) {
	f := informers.NewSharedInformerFactory(kc, 10*time.Minute)
	inf := f.Core().V1().Namespaces().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			ns := obj.(*corev1.Namespace)
			go func() {
				_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(c context.Context) (bool, error) {
					_, err := kc.CoreV1().ServiceAccounts(ns.Name).Create(c, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
					return err == nil || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) || apierrors.IsForbidden(err), nil
				})
			}()
		},
		DeleteFunc: func(obj interface{}) {
			ns, ok := obj.(*corev1.Namespace)
			if !ok {
				if t, ok2 := obj.(cache.DeletedFinalStateUnknown); ok2 {
					ns, ok = t.Obj.(*corev1.Namespace)
				}
				if !ok {
					return
				}
			}
			go deleteNamespaceContent(ctx, kc, dc, ns.Name)
		},
	})
	f.Start(ctx.Done())
}

func deleteNamespaceContent(ctx context.Context, kc kubernetes.Interface, dc dynamic.Interface, ns string) {
	lists, err := kc.Discovery().ServerPreferredNamespacedResources()
	if err != nil && lists == nil {
		klog.Warningf("namespace %s cleanup: %v", ns, err)
		return
	}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !containsVerb(r.Verbs, "deletecollection") {
				continue
			}
			err := dc.Resource(gv.WithResource(r.Name)).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				klog.V(2).Infof("namespace %s cleanup %s: %v", ns, r.Name, err)
			}
		}
	}
}

func containsVerb(vs []string, v string) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}
